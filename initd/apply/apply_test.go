package apply

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kilnproject/kiln/initd/config"
	"github.com/kilnproject/kiln/internal/nodeimage"
	"github.com/kilnproject/kiln/internal/testkit"
)

// newRoot makes a minimal node root: account databases with root and a user "core"
// (uid 1000, group core 1000), and a Debian-like /lib -> usr/lib.
func newRoot(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	files := map[string]string{
		"etc/passwd":  "root:x:0:0:root:/root:/bin/bash\ncore:x:1000:1000:Core:/home/core:/bin/bash\n",
		"etc/group":   "root:x:0:\nsudo:x:27:\ncore:x:1000:\n",
		"etc/shadow":  "root:*:19000:0:99999:7:::\ncore:*:19000:0:99999:7:::\n",
		"etc/gshadow": "root:*::\nsudo:*::\ncore:!::\n",
	}
	for p, data := range files {
		mode := fs.FileMode(0o644)
		if strings.Contains(p, "shadow") {
			mode = 0o640
		}
		writeHost(t, filepath.Join(root, p), data, mode)
	}
	for _, d := range []string{"usr/lib/systemd/system", "home/core", "root"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("usr/lib", filepath.Join(root, "lib")); err != nil {
		t.Fatal(err)
	}
	return root
}

func writeHost(t *testing.T, p, data string, mode fs.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(data), mode); err != nil {
		t.Fatal(err)
	}
}

// sameNode reports whether a user would notice no change between two snapshots of one
// node: type, mode, owner, content or link target, and the modification time of all but
// directories (those move with temporary files).
func sameNode(a, b testkit.Node) bool {
	return testkit.SameContent(a, b) && a.UID == b.UID && a.GID == b.GID && (a.Mode.IsDir() || a.MTime.Equal(b.MTime))
}

func sha(data []byte) string {
	s := sha256.Sum256(data)
	return "sha256-" + hex.EncodeToString(s[:])
}

func parse(t *testing.T, doc string) *config.Config {
	t.Helper()
	cfg, err := config.Parse([]byte(doc))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	return cfg
}

func files(t *testing.T, cfg *config.Config) []config.File {
	t.Helper()
	fs, err := cfg.Files()
	if err != nil {
		t.Fatalf("Files: %v", err)
	}
	return fs
}

func requireRoot(t *testing.T) {
	t.Helper()
	testkit.RequireRoot(t, "ownership and the shadow tools")
}

// fileWant is a file Files must leave: its path, contents, mode and owner.
type fileWant struct {
	path     string
	contents string
	mode     fs.FileMode
	uid, gid uint32
}

// filesCase is a root, storage.files entries, and what Files must make of them.
type filesCase struct {
	name    string
	setup   func(t *testing.T, root string)
	entries string // storage.files JSON list
	want    []fileWant
	wantErr string
}

// newFilesServer serves remote at /plain and gzipped at /gz.
func newFilesServer(t *testing.T, remote []byte) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/plain":
			w.Write(remote)
		case "/gz":
			w.Write(testkit.Gzip(t, remote))
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

func TestFiles(t *testing.T) {
	requireRoot(t)
	remote := []byte("downloaded\n")
	srv := newFilesServer(t, remote)
	for _, tc := range []filesCase{
		{name: "new files", entries: `[{"path":"/etc/hostname","contents":{"source":"data:,node-1%0A"}},
			{"path":"/etc/kubernetes/pki/ca.key","mode":384,"contents":{"source":"data:;base64,c2VjcmV0"}},
			{"path":"/home/core/notes","user":{"name":"core"},"group":{"name":"sudo"},"contents":{"source":"data:,hi"}},
			{"path":"/usr/local/bin/tool","mode":3565,"user":{"id":1000},"contents":{"source":"data:,x"}},
			{"path":"/etc/empty"}]`,
			want: []fileWant{{"/etc/hostname", "node-1\n", 0o644, 0, 0}, {"/etc/kubernetes/pki/ca.key", "secret", 0o600, 0, 0},
				{"/home/core/notes", "hi", 0o644, 1000, 27}, {"/usr/local/bin/tool", "x", 0o755 | fs.ModeSetuid | fs.ModeSetgid, 1000, 0},
				{"/etc/empty", "", 0o644, 0, 0}}},
		{name: "http and https with hash and gzip", entries: fmt.Sprintf(`[{"path":"/opt/a","contents":{"source":%q,"verification":{"hash":%q}}},
			{"path":"/opt/b","contents":{"source":%q,"compression":"gzip","verification":{"hash":%q}}}]`, srv.URL+"/plain", sha(remote), srv.URL+"/gz", sha(remote)),
			want: []fileWant{{"/opt/a", "downloaded\n", 0o644, 0, 0}, {"/opt/b", "downloaded\n", 0o644, 0, 0}}},
		{name: "tampered download writes nothing", entries: fmt.Sprintf(`[{"path":"/opt/ok","contents":{"source":"data:,ok"}},{"path":"/opt/a","contents":{"source":%q,"verification":{"hash":%q}}}]`,
			srv.URL+"/plain", sha([]byte("other"))),
			wantErr: "storage.files[1].contents.verification.hash: sha256 mismatch"},
		{name: "download fails", entries: fmt.Sprintf(`[{"path":"/opt/a","contents":{"source":%q,"verification":{"hash":%q}}}]`, srv.URL+"/missing", sha(remote)),
			wantErr: "storage.files[0].contents.source: fetch " + srv.URL + "/missing: server answered 404 Not Found"},
		{name: "existing other contents without overwrite", setup: func(t *testing.T, root string) { writeHost(t, root+"/etc/motd", "old", 0o644) },
			entries: `[{"path":"/etc/motd","contents":{"source":"data:,new"}}]`,
			wantErr: "storage.files[0] (/etc/motd): already exists (a regular file) with other contents and overwrite is false"},
		{name: "existing same contents without overwrite keeps mode", setup: func(t *testing.T, root string) { writeHost(t, root+"/etc/motd", "same", 0o640) },
			entries: `[{"path":"/etc/motd","contents":{"source":"data:,same"}}]`,
			want:    []fileWant{{"/etc/motd", "same", 0o640, 0, 0}}},
		{name: "overwrite replaces", setup: func(t *testing.T, root string) { writeHost(t, root+"/etc/motd", "old", 0o666) },
			entries: `[{"path":"/etc/motd","overwrite":true,"contents":{"source":"data:,new"}}]`,
			want:    []fileWant{{"/etc/motd", "new", 0o644, 0, 0}}},
		{name: "no contents keeps an existing file", setup: func(t *testing.T, root string) { writeHost(t, root+"/etc/keep", "kept", 0o644) },
			entries: `[{"path":"/etc/keep","mode":384}]`,
			want:    []fileWant{{"/etc/keep", "kept", 0o600, 0, 0}}},
		{name: "directory in the way", setup: func(t *testing.T, root string) { os.MkdirAll(root+"/etc/d", 0o755) },
			entries: `[{"path":"/etc/d","overwrite":true,"contents":{"source":"data:,x"}}]`,
			wantErr: "storage.files[0] (/etc/d): is a directory"},
		{name: "absolute symlink in the path stays inside the root", setup: func(t *testing.T, root string) {
			os.MkdirAll(root+"/srv/real", 0o755)
			os.Symlink("/srv/real", root+"/etc/alt")
		},
			entries: `[{"path":"/etc/alt/conf","contents":{"source":"data:,inside"}}]`,
			want:    []fileWant{{"/srv/real/conf", "inside", 0o644, 0, 0}}},
		{name: "unknown owner", entries: `[{"path":"/etc/x","user":{"name":"nobody2"},"contents":{"source":"data:,x"}}]`,
			wantErr: `storage.files[0].user.name: no user "nobody2" in /etc/passwd`},
	} {
		t.Run(tc.name, func(t *testing.T) { checkFiles(t, tc) })
	}
}

// checkFiles runs Files on a new root: it fails as the case says, leaving the root as it was
// when a download fails; or it writes the wanted files and a second run changes nothing.
func checkFiles(t *testing.T, tc filesCase) {
	root := newRoot(t)
	if tc.setup != nil {
		tc.setup(t, root)
	}
	cfg := parse(t, `{"ignition":{"version":"3.6.0"},"storage":{"files":`+tc.entries+`}}`)
	before := testkit.Snapshot(t, root)
	changed, err := Files(context.Background(), root, files(t, cfg), nil)
	if tc.wantErr != "" {
		if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
			t.Fatalf("Files error = %v, want %q", err, tc.wantErr)
		}
		if strings.Contains(tc.name, "writes nothing") {
			if d := before.Diff(testkit.Snapshot(t, root), sameNode); len(d) > 0 {
				t.Errorf("a failed fetch changed the root: %q", d)
			}
		}
		return
	}
	if err != nil {
		t.Fatalf("Files: %v", err)
	}
	checkFileWants(t, root, tc.want)
	// Idempotence: the second run changes nothing, not even an mtime.
	after := testkit.Snapshot(t, root)
	again, err := Files(context.Background(), root, files(t, cfg), nil)
	if err != nil || len(again) != 0 {
		t.Errorf("second Files = %q, %v; want nothing changed (first run changed %q)", again, err, changed)
	}
	if d := after.Diff(testkit.Snapshot(t, root), sameNode); len(d) > 0 {
		t.Errorf("second run changed the root: %q", d)
	}
	if strings.HasPrefix(tc.name, "existing same") && len(changed) != 0 {
		t.Errorf("identical file counted as changed: %q", changed)
	}
}

// checkFileWants checks each wanted file's contents, mode and owner under root.
func checkFileWants(t *testing.T, root string, wants []fileWant) {
	t.Helper()
	for _, w := range wants {
		p := filepath.Join(root, w.path)
		data, err := os.ReadFile(p)
		if err != nil {
			t.Errorf("%s: %v", w.path, err)
			continue
		}
		fi, _ := os.Lstat(p)
		st := fi.Sys().(*syscall.Stat_t)
		got := fileWant{w.path, string(data), modeOf(fi), st.Uid, st.Gid}
		if got != w {
			t.Errorf("got  %+v\nwant %+v", got, w)
		}
	}
}

func TestFilesRerunOffline(t *testing.T) {
	root := newRoot(t)
	body := []byte("payload")
	cfg := parse(t, fmt.Sprintf(`{"ignition":{"version":"3.5.0"},"storage":{"files":[{"path":"/opt/p","contents":{"source":"https://example.com/p.gz","compression":"gzip","verification":{"hash":%q}}}]}}`, sha(body)))
	calls := 0
	get := func(context.Context, string) ([]byte, error) {
		calls++
		return testkit.Gzip(t, body), nil
	}
	for run, wantCalls := range []int{1, 1} {
		changed, err := Files(context.Background(), root, files(t, cfg), get)
		if err != nil {
			t.Fatalf("run %d: %v", run, err)
		}
		if calls != wantCalls || (run == 0) != (len(changed) == 1) {
			t.Errorf("run %d: %d downloads, changed %q", run, calls, changed)
		}
	}
}

func TestDirectoriesAndLinks(t *testing.T) {
	requireRoot(t)
	root := newRoot(t)
	writeHost(t, root+"/usr/bin/kubectl", "bin", 0o755)
	writeHost(t, root+"/etc/old-link-target", "x", 0o644)
	os.Symlink("/elsewhere", root+"/etc/replace-me")
	cfg := parse(t, `{"ignition":{"version":"3.5.0"},"storage":{
		"directories":[{"path":"/srv/data","mode":448,"user":{"name":"core"},"group":{"name":"core"}},{"path":"/home/core","mode":488}],
		"links":[{"path":"/usr/local/bin/kubectl","target":"/usr/bin/kubectl"},
			{"path":"/usr/local/bin/k","target":"kubectl","user":{"name":"core"}},
			{"path":"/etc/replace-me","target":"/usr/bin/kubectl","overwrite":true},
			{"path":"/opt/kubectl-hard","target":"/usr/bin/kubectl","hard":true}]}}`)
	ctx := context.Background()

	dirs, err := Directories(ctx, root, cfg.Ignition.Storage.Directories)
	if err != nil {
		t.Fatalf("Directories: %v", err)
	}
	if !reflect.DeepEqual(dirs, []string{"/srv/data", "/home/core"}) {
		t.Errorf("Directories changed %q", dirs)
	}
	links, err := Links(ctx, root, cfg.Ignition.Storage.Links)
	if err != nil {
		t.Fatalf("Links: %v", err)
	}
	if len(links) != 4 {
		t.Errorf("Links changed %q, want 4", links)
	}
	snap := testkit.Snapshot(t, root)
	checks := []struct {
		path string
		want testkit.Node
	}{
		{"/srv/data", testkit.Node{Mode: fs.ModeDir | 0o700, UID: 1000, GID: 1000}},
		{"/home/core", testkit.Node{Mode: fs.ModeDir | 0o750}},
		{"/usr/local/bin/kubectl", testkit.Node{Mode: fs.ModeSymlink, Content: "/usr/bin/kubectl"}},
		{"/usr/local/bin/k", testkit.Node{Mode: fs.ModeSymlink, Content: "kubectl", UID: 1000}},
		{"/etc/replace-me", testkit.Node{Mode: fs.ModeSymlink, Content: "/usr/bin/kubectl"}},
	}
	for _, c := range checks {
		got := snap[strings.TrimPrefix(c.path, "/")]
		got.MTime, got.Size, got.Nlink = time.Time{}, 0, 0
		if got.Mode&fs.ModeSymlink != 0 {
			got.Mode = fs.ModeSymlink
		}
		if got != c.want {
			t.Errorf("%s = %+v, want %+v", c.path, got, c.want)
		}
	}
	a, _ := os.Stat(root + "/usr/bin/kubectl")
	b, _ := os.Stat(root + "/opt/kubectl-hard")
	if !os.SameFile(a, b) {
		t.Error("hard link is not the same file as its target")
	}

	// Second run: nothing changes.
	if d, err := Directories(ctx, root, cfg.Ignition.Storage.Directories); err != nil || len(d) != 0 {
		t.Errorf("second Directories = %q, %v", d, err)
	}
	if l, err := Links(ctx, root, cfg.Ignition.Storage.Links); err != nil || len(l) != 0 {
		t.Errorf("second Links = %q, %v", l, err)
	}
	if d := snap.Diff(testkit.Snapshot(t, root), sameNode); len(d) > 0 {
		t.Errorf("second run changed the root: %q", d)
	}

	checkStorageErrors(t, root)
}

// checkStorageErrors checks that links and directories in the way fail naming the entry.
func checkStorageErrors(t *testing.T, root string) {
	t.Helper()
	ctx := context.Background()
	bad := []struct{ doc, want string }{
		{`"links":[{"path":"/etc/old-link-target","target":"/x"}]`, "storage.links[0] (/etc/old-link-target): exists (a regular file) and is not the wanted link, and overwrite is false"},
		{`"links":[{"path":"/opt/h","target":"/nope","hard":true}]`, "storage.links[0].target: hard link target /nope"},
		{`"links":[{"path":"/srv","target":"/x","overwrite":true}]`, "storage.links[0] (/srv): is a directory"},
		{`"directories":[{"path":"/etc/old-link-target"}]`, "storage.directories[0] (/etc/old-link-target): exists and is a regular file, not a directory, and overwrite is false"},
	}
	for _, c := range bad {
		cfg := parse(t, `{"ignition":{"version":"3.5.0"},"storage":{`+c.doc+`}}`)
		_, err1 := Links(ctx, root, cfg.Ignition.Storage.Links)
		_, err2 := Directories(ctx, root, cfg.Ignition.Storage.Directories)
		err := err1
		if err == nil {
			err = err2
		}
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("error = %v, want %q", err, c.want)
		}
	}
}

func TestUnits(t *testing.T) {
	requireRoot(t)
	root := newRoot(t)
	writeHost(t, root+"/usr/lib/systemd/system/chronyd.service", "[Service]\nExecStart=/bin/true\n[Install]\nWantedBy=multi-user.target\n", 0o644)
	os.MkdirAll(root+"/etc/systemd/system/multi-user.target.wants", 0o755)
	os.Symlink("/lib/systemd/system/chronyd.service", root+"/etc/systemd/system/multi-user.target.wants/chronyd.service")
	cfg := parse(t, `{"ignition":{"version":"3.5.0"},"systemd":{"units":[
		{"name":"hello.service","enabled":true,"contents":"[Service]\nExecStart=/bin/echo hello\n[Install]\nWantedBy=multi-user.target\n",
		 "dropins":[{"name":"10-env.conf","contents":"[Service]\nEnvironment=A=1\n"}]},
		{"name":"chronyd.service","enabled":false},
		{"name":"debug-shell.service","mask":true},
		{"name":"kubelet.service","dropins":[{"name":"20-kiln.conf","contents":"[Service]\nEnvironment=B=2\n"}]}]}}`)
	ctx := context.Background()
	changed, reload, err := Units(ctx, root, cfg.Ignition.Systemd.Units)
	if err != nil {
		t.Fatalf("Units: %v", err)
	}
	want := []string{"/etc/systemd/system/hello.service", "/etc/systemd/system/hello.service.d/10-env.conf", "/etc/systemd/system/hello.service",
		"/etc/systemd/system/chronyd.service", "/etc/systemd/system/debug-shell.service", "/etc/systemd/system/kubelet.service.d/20-kiln.conf"}
	if !reflect.DeepEqual(changed, want) || !reload {
		t.Errorf("Units = %q, reload %v\nwant %q, true", changed, reload, want)
	}
	snap := testkit.Snapshot(t, root)
	for p, w := range map[string]string{
		"/etc/systemd/system/multi-user.target.wants/hello.service": "/etc/systemd/system/hello.service",
		"/etc/systemd/system/debug-shell.service":                   "/dev/null",
	} {
		if snap[strings.TrimPrefix(p, "/")].Content != w {
			t.Errorf("%s -> %q, want %q", p, snap[strings.TrimPrefix(p, "/")].Content, w)
		}
	}
	if _, ok := snap["etc/systemd/system/multi-user.target.wants/chronyd.service"]; ok {
		t.Error("chronyd.service still enabled")
	}
	if s := snap["etc/systemd/system/hello.service"]; s.Mode != 0o644 || s.UID != 0 {
		t.Errorf("unit file %+v", s)
	}
	changed, reload, err = Units(ctx, root, cfg.Ignition.Systemd.Units)
	if err != nil || len(changed) != 0 || reload {
		t.Errorf("second Units = %q, %v, %v; want nothing", changed, reload, err)
	}
	if d := snap.Diff(testkit.Snapshot(t, root), sameNode); len(d) > 0 {
		t.Errorf("second run changed the root: %q", d)
	}
	// A static unit cannot be enabled: the error names the field.
	bad := parse(t, `{"ignition":{"version":"3.5.0"},"systemd":{"units":[{"name":"a.service"},{"name":"static.service","enabled":true,"contents":"[Service]\nExecStart=/bin/true\n"}]}}`)
	if _, _, err := Units(ctx, root, bad.Ignition.Systemd.Units); err == nil || !strings.Contains(err.Error(), "systemd.units[1].enabled: enable: unit static.service: no [Install] section") {
		t.Errorf("static unit error = %v", err)
	}
}

func requireShadowTools(t *testing.T) {
	t.Helper()
	requireRoot(t)
	testkit.Tools(t, "useradd", "usermod", "groupadd")
}

const (
	keyA = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIO3StSM+Z0fcvKzvDFRc5J42hHUIvqb34l+kqVYzwQ6k alice@example"
	keyB = "ecdsa-sha2-nistp256 AAAAE2VjZHNhLXNoYTItbmlzdHAyNTYAAAAIbmlzdHAyNTYAAABBBNbQSXFgTLGAliugoFbysXTmQuJYlzR75/jc8zg0QlZppZMF5Ck8OOuC7FwCum//7NX9caQk0gx1Dg09apc5+9g="
)

func TestUsers(t *testing.T) {
	requireShadowTools(t)
	root := newRoot(t)
	cfg := parse(t, `{"ignition":{"version":"3.5.0"},"passwd":{
		"groups":[{"name":"ops","gid":2000},{"name":"core"}],
		"users":[{"name":"alice","uid":1500,"gecos":"Alice","shell":"/bin/sh","groups":["sudo","ops"],"sshAuthorizedKeys":["`+keyA+`","`+keyB+`"]},
			{"name":"core","groups":["ops"],"sshAuthorizedKeys":["`+keyB+`"]},
			{"name":"svc","system":true,"noCreateHome":true,"homeDir":"/var/lib/svc","passwordHash":"$y$j9T$salt$hash"}]}}`)
	ctx := context.Background()
	changed, err := Users(ctx, root, cfg.Ignition.Passwd.Users, cfg.Ignition.Passwd.Groups)
	if err != nil {
		t.Fatalf("Users: %v", err)
	}
	want := []string{"/etc/passwd", "/etc/shadow", "/etc/group", "/etc/gshadow", "/home/alice", "/home/alice/.ssh/authorized_keys", "/home/core/.ssh/authorized_keys"}
	if !reflect.DeepEqual(changed, want) {
		t.Errorf("Users changed %q\nwant %q", changed, want)
	}
	snap := checkUsersApplied(t, root)

	// Second run: no tool runs, nothing changes.
	again, err := Users(ctx, root, cfg.Ignition.Passwd.Users, cfg.Ignition.Passwd.Groups)
	if err != nil || len(again) != 0 {
		t.Errorf("second Users = %q, %v", again, err)
	}
	if d := snap.Diff(testkit.Snapshot(t, root), sameNode); len(d) > 0 {
		t.Errorf("second run changed the root: %q", d)
	}

	// A changed config converges with usermod.
	cfg2 := parse(t, `{"ignition":{"version":"3.5.0"},"passwd":{"users":[{"name":"alice","shell":"/bin/bash","groups":["core"]}]}}`)
	changed, err = Users(ctx, root, cfg2.Ignition.Passwd.Users, nil)
	if err != nil || !reflect.DeepEqual(changed, []string{"/etc/passwd", "/etc/shadow", "/etc/group", "/etc/gshadow"}) {
		t.Errorf("Users(changed shell) = %q, %v", changed, err)
	}
	passwd, _ := os.ReadFile(root + "/etc/passwd")
	if !strings.Contains(string(passwd), "alice:x:1500:") || !strings.Contains(string(passwd), ":/home/alice:/bin/bash\n") {
		t.Errorf("/etc/passwd:\n%s", passwd)
	}

	checkUsersErrors(t, root)
}

// checkUsersApplied checks the accounts, groups, shadow entries, homes and authorized keys
// TestUsers's config makes, and returns a snapshot of the root.
func checkUsersApplied(t *testing.T, root string) testkit.Tree {
	t.Helper()
	tr, _ := openTree(root)
	acc, err := tr.loadAccounts()
	tr.Close()
	if err != nil {
		t.Fatal(err)
	}
	alice := acc.users["alice"]
	if alice.UID != 1500 || alice.Gecos != "Alice" || alice.Shell != "/bin/sh" || alice.Home != "/home/alice" {
		t.Errorf("alice = %+v", alice)
	}
	if g := acc.groups["ops"]; g.GID != 2000 || !reflect.DeepEqual(g.Members, []string{"alice", "core"}) {
		t.Errorf("ops = %+v", g)
	}
	if g := acc.groups["sudo"]; !reflect.DeepEqual(g.Members, []string{"alice"}) {
		t.Errorf("sudo = %+v", g)
	}
	if g := acc.groups["alice"]; g.GID != alice.GID {
		t.Errorf("alice's user group %+v, primary gid %d", g, alice.GID)
	}
	shadow, _ := os.ReadFile(root + "/etc/shadow")
	for _, w := range []string{"alice:*:", "svc:$y$j9T$salt$hash:"} {
		if !strings.Contains(string(shadow), "\n"+w) {
			t.Errorf("/etc/shadow lacks %q:\n%s", w, shadow)
		}
	}
	if _, err := os.Stat(root + "/var/lib/svc"); !os.IsNotExist(err) {
		t.Errorf("noCreateHome: /var/lib/svc exists (%v)", err)
	}
	snap := testkit.Snapshot(t, root)
	keys := snap["home/alice/.ssh/authorized_keys"]
	if keys.Mode != 0o600 || keys.UID != 1500 || keys.GID != uint32(alice.GID) {
		t.Errorf("authorized_keys %+v", keys)
	}
	if d := snap["home/alice/.ssh"]; d.Mode != fs.ModeDir|0o700 || d.UID != 1500 {
		t.Errorf("~/.ssh %+v", d)
	}
	data, _ := os.ReadFile(root + "/home/alice/.ssh/authorized_keys")
	if !strings.HasSuffix(string(data), keyA+"\n"+keyB+"\n") || !strings.HasPrefix(string(data), "# Written by kiln-init") {
		t.Errorf("authorized_keys =\n%s", data)
	}
	if c := snap["home/core/.ssh/authorized_keys"]; c.UID != 1000 || c.GID != 1000 {
		t.Errorf("core's keys %+v", c)
	}
	return snap
}

// checkUsersErrors checks that groups and users at odds with the root fail naming the field.
func checkUsersErrors(t *testing.T, root string) {
	t.Helper()
	ctx := context.Background()
	bad := []struct{ doc, want string }{
		{`"groups":[{"name":"ops","gid":3000}]`, "passwd.groups[0] (ops): passwd.groups[0].gid: group exists with gid 2000, the config says 3000"},
		{`"users":[{"name":"bob","groups":["nosuch"]}]`, `passwd.users[0] (bob): passwd.users[0].groups[0]: no group "nosuch" in /etc/group`},
		{`"users":[{"name":"bob","uid":1500}]`, "passwd.users[0] (bob): useradd --uid 1500"},
	}
	for _, c := range bad {
		cfg := parse(t, `{"ignition":{"version":"3.5.0"},"passwd":{`+c.doc+`}}`)
		_, err := Users(ctx, root, cfg.Ignition.Passwd.Users, cfg.Ignition.Passwd.Groups)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("error = %v, want %q", err, c.want)
		}
	}
}

// butaneDoc is a Butane document using every applier.
const butaneDoc = `variant: fcos
version: 1.6.0
passwd:
  groups:
    - name: kube
      gid: 1100
  users:
    - name: admin
      groups: [sudo, kube]
      ssh_authorized_keys:
        - ` + keyA + `
storage:
  directories:
    - path: /var/lib/kiln
      mode: 0700
  files:
    - path: /etc/kiln/node.yaml
      mode: 0600
      contents:
        inline: |
          cluster: {name: prod, dnsZone: example.com}
          role: worker
    - path: /home/admin/.bashrc
      user: {name: admin}
      group: {name: kube}
      contents:
        inline: "set -o vi\n"
  links:
    - path: /usr/local/bin/ctr
      target: /usr/bin/containerd
systemd:
  units:
    - name: kiln-hello.service
      enabled: true
      contents: |
        [Unit]
        Description=hello
        [Service]
        Type=oneshot
        ExecStart=/bin/echo hello
        [Install]
        WantedBy=multi-user.target
`

// applyAll parses doc and runs every applier on root in the documented order, and returns
// what they changed.
func applyAll(t *testing.T, root, doc string) []string {
	t.Helper()
	cfg := parse(t, doc)
	ctx := context.Background()
	var all []string
	ign := cfg.Ignition
	c, err := Users(ctx, root, ign.Passwd.Users, ign.Passwd.Groups)
	if err != nil {
		t.Fatalf("Users: %v", err)
	}
	all = append(all, c...)
	if c, err = Directories(ctx, root, ign.Storage.Directories); err != nil {
		t.Fatalf("Directories: %v", err)
	}
	all = append(all, c...)
	if c, err = Files(ctx, root, files(t, cfg), nil); err != nil {
		t.Fatalf("Files: %v", err)
	}
	all = append(all, c...)
	if c, err = Links(ctx, root, ign.Storage.Links); err != nil {
		t.Fatalf("Links: %v", err)
	}
	all = append(all, c...)
	c, _, err = Units(ctx, root, ign.Systemd.Units)
	if err != nil {
		t.Fatalf("Units: %v", err)
	}
	return append(all, c...)
}

// TestButaneEndToEnd takes a Butane document through Parse, Validate and every applier
// in the documented order, twice.
func TestButaneEndToEnd(t *testing.T) {
	requireShadowTools(t)
	root := newRoot(t)
	writeHost(t, root+"/usr/bin/containerd", "bin", 0o755)
	first := applyAll(t, root, butaneDoc)
	if len(first) < 8 {
		t.Errorf("first run changed only %q", first)
	}
	node, err := config.LoadNode(root + nodeimage.NodeConfigPath)
	if err != nil || node.Role != config.RoleWorker {
		t.Errorf("node.yaml written by the config: %+v, %v", node, err)
	}
	snap := testkit.Snapshot(t, root)
	if s := snap["etc/kiln/node.yaml"]; s.Mode != 0o600 {
		t.Errorf("node.yaml mode %v", s.Mode)
	}
	if s := snap["home/admin/.bashrc"]; s.GID != 1100 {
		t.Errorf(".bashrc %+v, want group kube (1100)", s)
	}
	if s := snap["etc/systemd/system/multi-user.target.wants/kiln-hello.service"]; s.Content != "/etc/systemd/system/kiln-hello.service" {
		t.Errorf("kiln-hello.service not enabled: %+v", s)
	}
	if second := applyAll(t, root, butaneDoc); len(second) != 0 {
		t.Errorf("second run changed %q", second)
	}
	if d := snap.Diff(testkit.Snapshot(t, root), sameNode); len(d) > 0 {
		t.Errorf("second run changed the root: %q", d)
	}
}
