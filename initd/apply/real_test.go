package apply

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/coreos/ignition/v2/config/v3_6/types"

	"github.com/kilnproject/kiln/initd/config"
	"github.com/kilnproject/kiln/internal/nodeimage"
	"github.com/kilnproject/kiln/internal/testkit"
)

// realDir holds configs copied from the Fedora CoreOS, Butane, Ignition and Flatcar
// documentation, each with the outcome it must have on a kiln node (see its README.md).
var realDir = filepath.Join("..", "config", "testdata", "real")

// realCase is one config of the corpus and the outcome it must have.
type realCase struct {
	name, file string
	// outcome is "applied", "refused" (by Parse or Validate, as kiln run --config and
	// first boot refuse it), "refused against the image" (by the check of kiln check-config
	// and kiln run --config against the default image's recorded contents) or "fails at
	// first boot" (accepted, then an applier fails).
	outcome string
	// message is the exact error of a refusal or a failure.
	message string
}

// The outcomes a config of the corpus may have.
const (
	outcomeApplied = "applied"
	outcomeRefused = "refused"
	outcomeImage   = "refused against the image"
	outcomeFails   = "fails at first boot"
)

// loadRealCases reads every .bu and .ign of the corpus with its outcome: a Butane file
// says it in "# want: …" header lines, an Ignition file in the "want: …" lines of the
// .want file beside it; further lines of a message follow as "# | …" or "| …".
func loadRealCases(t *testing.T) []realCase {
	t.Helper()
	entries, err := os.ReadDir(realDir)
	if err != nil {
		t.Fatal(err)
	}
	var cases []realCase
	for _, e := range entries {
		ext := path.Ext(e.Name())
		if ext != ".bu" && ext != ".ign" {
			continue
		}
		c := realCase{name: strings.TrimSuffix(e.Name(), ext), file: filepath.Join(realDir, e.Name())}
		wantFile, prefix := c.file, "# "
		if ext == ".ign" {
			wantFile, prefix = filepath.Join(realDir, c.name+".want"), ""
		}
		want, err := readWant(wantFile, prefix)
		if err != nil {
			t.Fatal(err)
		}
		c.outcome, c.message, _ = strings.Cut(want, ": ")
		switch c.outcome {
		case outcomeApplied:
			if c.message != "" {
				t.Fatalf("%s: %q takes no message", wantFile, c.outcome)
			}
		case outcomeRefused, outcomeImage, outcomeFails:
			if c.message == "" {
				t.Fatalf("%s: %q needs the exact message", wantFile, c.outcome)
			}
		default:
			t.Fatalf("%s: want %q is none of %q, %q, %q, %q", wantFile, want, outcomeApplied, outcomeRefused+": …", outcomeImage+": …", outcomeFails+": …")
		}
		cases = append(cases, c)
	}
	return cases
}

// readWant returns the outcome written in file's "want: " line and its "| " continuation
// lines, each behind prefix.
func readWant(file, prefix string) (string, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return "", err
	}
	var want []string
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := sc.Text()
		if w, ok := strings.CutPrefix(line, prefix+"want: "); ok {
			want = append(want, w)
		} else if w, ok := strings.CutPrefix(line, prefix+"| "); ok && len(want) > 0 {
			want = append(want, w)
		}
	}
	if len(want) == 0 {
		return "", fmt.Errorf("%s: no %q line", file, prefix+"want: ")
	}
	return strings.Join(want, "\n"), nil
}

// TestRealConfigs takes each config of the corpus as a node does: parsed (Butane with the
// corpus's files directory for its local keys, as kiln run --config --files-dir), validated,
// its references followed (served from files/remote), its kernelArguments edited into a boot
// entry's options line, and applied by every applier in first boot's order into a root laid
// out like a kiln node. A config must be refused or fail with exactly its message, or be applied: then the
// files, directories, links, units and accounts it asks for are there, nothing under /usr
// (but /usr/local) or any other read-only part changed, and a second run changes nothing.
// Parsing and validating need nothing; applying needs root and the shadow tools, without
// which the configs that pass validation are skipped.
func TestRealConfigs(t *testing.T) {
	cases := loadRealCases(t)
	if len(cases) < 24 {
		t.Fatalf("the corpus holds %d configs, want at least 24", len(cases))
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { checkRealCase(t, c) })
	}
}

func checkRealCase(t *testing.T, c realCase) {
	raw, err := os.ReadFile(c.file)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := config.ParseWith(raw, config.Options{FilesDir: filepath.Join(realDir, "files")})
	if err == nil {
		err = cfg.Validate()
	}
	if err != nil || c.outcome == outcomeRefused {
		if err == nil || c.outcome != outcomeRefused || err.Error() != c.message {
			t.Fatalf("Parse and Validate: %v\nwant %s: %s", err, c.outcome, c.message)
		}
		return
	}
	// First boot follows the configs it references (ignition.config.merge, replace) before
	// anything else; kiln check-config does too.
	if cfg, err = cfg.Render(context.Background(), config.RenderOptions{Get: corpusGetter}); err != nil {
		if c.outcome != outcomeFails || err.Error() != c.message {
			t.Fatalf("Render: %v\nwant %s: %s", err, c.outcome, c.message)
		}
		return
	}
	checkKernelArgs(t, cfg)
	// As kiln check-config against the default worker image: its contents and its role.
	if err := errors.Join(cfg.CheckImage(imageContents(t)), cfg.CheckRole(config.RoleWorker)); err != nil || c.outcome == outcomeImage {
		if err == nil || c.outcome != outcomeImage || err.Error() != c.message {
			t.Fatalf("CheckImage: %v\nwant %s: %s", err, c.outcome, c.message)
		}
		return
	}
	// First boot enables the image's ssh server for a config that gives users keys.
	cfg.EnableSSHForKeys(imageContents(t).HasUnit(config.SSHUnit))
	requireShadowTools(t)
	root := newNodeRoot(t)
	before := testkit.Snapshot(t, root)
	_, err = applyConfig(root, cfg)
	if err != nil || c.outcome == outcomeFails {
		if err == nil || c.outcome != outcomeFails || err.Error() != c.message {
			t.Fatalf("apply: %v\nwant %s: %s", err, c.outcome, c.message)
		}
		return
	}
	checkWritable(t, before, testkit.Snapshot(t, root))
	checkApplied(t, root, cfg)
	after := testkit.Snapshot(t, root)
	if again, err := applyConfig(root, cfg); err != nil || len(again) > 0 {
		t.Errorf("second run changed %q, %v", again, err)
	}
	if d := after.Diff(testkit.Snapshot(t, root), sameNode); len(d) > 0 {
		t.Errorf("second run changed the root: %q", d)
	}
}

// kernelOptions is the options line of a qemu image's boot entry, as the bake writes it.
const kernelOptions = "root=PARTUUID=0f8c2a9e-6b1d-4d57-9a43-2c1e5b7d9f10 rootfstype=erofs ro kiln.platform=qemu console=ttyS0,115200 tsc=reliable"

// checkKernelArgs checks that the config's kernelArguments, as first boot writes them into
// the booted slot's boot entry, hold on its options line and keep what the boot needs.
func checkKernelArgs(t *testing.T, cfg *config.Config) {
	t.Helper()
	k := cfg.KernelArgs()
	if k.Empty() {
		return
	}
	edited, _, _, err := k.Edit(kernelOptions)
	if err != nil {
		t.Fatalf("kernelArguments: %v", err)
	}
	if !k.HeldBy(edited) || !strings.HasPrefix(edited, "root=PARTUUID=0f8c2a9e-6b1d-4d57-9a43-2c1e5b7d9f10 rootfstype=erofs ro kiln.platform=qemu ") {
		t.Errorf("the boot entry's options become %q", edited)
	}
}

// imageContents is what the bake recorded of the default worker image (contents in
// qemu-worker.json), against which kiln check-config and kiln run --config check a config.
func imageContents(t *testing.T) *nodeimage.Contents {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(realDir, "base", "contents.json"))
	if err != nil {
		t.Fatal(err)
	}
	var c nodeimage.Contents
	if err := json.Unmarshal(data, &c); err != nil {
		t.Fatalf("base/contents.json: %v", err)
	}
	return &c
}

// newNodeRoot lays out a root as a kiln node has it: the base image's account databases,
// /home and /root as links into /var, /lib, /bin and /sbin as links into /usr, the
// writable /usr/local and /opt, and the unit directories.
func newNodeRoot(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	for _, f := range []string{"passwd", "group", "shadow", "gshadow"} {
		data, err := os.ReadFile(filepath.Join(realDir, "base", "etc", f))
		if err != nil {
			t.Fatal(err)
		}
		mode := fs.FileMode(0o644)
		if strings.Contains(f, "shadow") {
			mode = 0o640
		}
		writeHost(t, filepath.Join(root, "etc", f), string(data), mode)
	}
	for _, d := range []string{"usr/bin", "usr/sbin", "usr/lib/systemd/system", "usr/local/bin", "usr/share/zoneinfo/America",
		"opt", "var/home", "var/roothome", "etc/systemd/system"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	writeHost(t, root+"/usr/lib/systemd/system/serial-getty@.service", "[Service]\nExecStart=-/sbin/agetty -o '-p -- \\\\u' --keep-baud 115200,57600,38400,9600 - $TERM\n", 0o644)
	writeHost(t, root+"/usr/share/zoneinfo/America/New_York", "TZif", 0o644)
	writeHost(t, root+"/usr/lib/systemd/system/ssh.service", "[Service]\nExecStart=/usr/sbin/sshd -D\n[Install]\nWantedBy=multi-user.target\nAlias=sshd.service\n", 0o644)
	for link, target := range map[string]string{"home": "var/home", "root": "var/roothome", "lib": "usr/lib", "bin": "usr/bin", "sbin": "usr/sbin"} {
		if err := os.Symlink(target, filepath.Join(root, link)); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// applyConfig runs every applier on root in first boot's order (users, directories,
// files, links, units) and returns what they changed. Remote contents are served from
// files/remote/<host><path> of the corpus.
func applyConfig(root string, cfg *config.Config) ([]string, error) {
	ctx := context.Background()
	ign := cfg.Ignition
	var all []string
	add := func(c []string, err error) error {
		all = append(all, c...)
		return err
	}
	if err := add(Users(ctx, root, ign.Passwd.Users, ign.Passwd.Groups)); err != nil {
		return all, err
	}
	if err := add(Directories(ctx, root, ign.Storage.Directories)); err != nil {
		return all, err
	}
	files, err := cfg.Files()
	if err != nil {
		return all, err
	}
	if err := add(Files(ctx, root, files, corpusGetter)); err != nil {
		return all, err
	}
	if err := add(Links(ctx, root, ign.Storage.Links)); err != nil {
		return all, err
	}
	changed, _, err := Units(ctx, root, ign.Systemd.Units)
	return all, add(changed, err)
}

// corpusGetter serves an http(s) URL from files/remote/<host><path> of the corpus.
func corpusGetter(_ context.Context, raw string) ([]byte, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, err
	}
	return os.ReadFile(filepath.Join(realDir, "files", "remote", u.Host, filepath.FromSlash(u.Path)))
}

// writablePrefixes are where a kiln node can write: /etc, /var (with /home and /root,
// links into it) and the overlays on /usr/local and /opt. Everything else is the
// read-only image.
var writablePrefixes = []string{"etc/", "var/", "usr/local/", "opt/"}

// checkWritable fails for every change between two snapshots of a node root outside the
// writable locations.
func checkWritable(t *testing.T, before, after testkit.Tree) {
	t.Helper()
	for _, d := range before.Diff(after, sameNode) {
		_, p, _ := strings.Cut(d, " ")
		p, _, _ = strings.Cut(p, ":")
		if !slices.ContainsFunc(writablePrefixes, func(w string) bool { return strings.HasPrefix(p+"/", w) }) {
			t.Errorf("write to the read-only image: %s", d)
		}
	}
}

// checkApplied checks what a user of the node would notice of cfg under root: its files
// with their contents, mode and owner, its directories, links, units (enabled, masked,
// drop-ins), groups and users with their groups, password hash and ssh keys.
func checkApplied(t *testing.T, root string, cfg *config.Config) {
	t.Helper()
	tr, err := openTree(root)
	if err != nil {
		t.Fatal(err)
	}
	acc, err := tr.loadAccounts()
	tr.Close()
	if err != nil {
		t.Fatal(err)
	}
	ign := cfg.Ignition
	checkAppliedStorage(t, root, cfg, acc)
	checkAppliedUnits(t, root, ign.Systemd.Units)
	for _, g := range ign.Passwd.Groups {
		got, ok := acc.groups[g.Name]
		if !ok || (g.Gid != nil && got.GID != *g.Gid) {
			t.Errorf("group %s: %+v (present %v), want gid %v", g.Name, got, ok, g.Gid)
		}
	}
	shadow, _ := os.ReadFile(root + "/etc/shadow")
	for _, u := range ign.Passwd.Users {
		got, ok := acc.users[u.Name]
		if !ok {
			t.Errorf("user %s missing from /etc/passwd", u.Name)
			continue
		}
		if u.UID != nil && got.UID != *u.UID {
			t.Errorf("user %s: uid %d, want %d", u.Name, got.UID, *u.UID)
		}
		for _, g := range u.Groups {
			if !slices.Contains(acc.groups[string(g)].Members, u.Name) {
				t.Errorf("user %s is not in group %s", u.Name, g)
			}
		}
		if u.PasswordHash != nil && !strings.Contains(string(shadow), "\n"+u.Name+":"+*u.PasswordHash+":") {
			t.Errorf("user %s: /etc/shadow lacks the password hash", u.Name)
		}
		if len(u.SSHAuthorizedKeys) > 0 {
			keys, err := os.ReadFile(filepath.Join(root, got.Home, ".ssh", "authorized_keys"))
			if err != nil {
				t.Errorf("user %s: %v", u.Name, err)
			}
			for _, k := range u.SSHAuthorizedKeys {
				if !strings.Contains(string(keys), string(k)+"\n") {
					t.Errorf("user %s: authorized_keys lacks %.40s…", u.Name, k)
				}
			}
		}
	}
}

// checkAppliedStorage checks the config's files, directories and links under root.
func checkAppliedStorage(t *testing.T, root string, cfg *config.Config, acc *accounts) {
	t.Helper()
	files, err := cfg.Files()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if f, err = f.Fetch(context.Background(), corpusGetter); err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(root, f.Path)
		data, err := os.ReadFile(p)
		if err != nil {
			t.Errorf("%s: %v", f.Field, err)
			continue
		}
		fi, _ := os.Stat(p)
		if f.HasContents && !bytes.Equal(data, f.Contents) {
			t.Errorf("%s: %s holds %q, want %q", f.Field, f.Path, data, f.Contents)
		}
		if f.ModeSet && modeOf(fi) != f.Mode {
			t.Errorf("%s: %s has mode %v, want %v", f.Field, f.Path, modeOf(fi), f.Mode)
		}
		checkOwner(t, f.Field+" ("+f.Path+")", fi, f.User, f.Group, acc)
	}
	for i, d := range cfg.Ignition.Storage.Directories {
		fi, err := os.Stat(filepath.Join(root, d.Path))
		if err != nil || !fi.IsDir() {
			t.Errorf("storage.directories[%d] (%s): not a directory (%v)", i, d.Path, err)
			continue
		}
		checkOwner(t, d.Path, fi, config.NodeUser(d.User), config.NodeGroup(d.Group), acc)
	}
	for i, l := range cfg.Ignition.Storage.Links {
		p := filepath.Join(root, l.Path)
		if l.Hard != nil && *l.Hard {
			a, errA := os.Stat(p)
			b, errB := os.Stat(filepath.Join(root, *l.Target))
			if errA != nil || errB != nil || !os.SameFile(a, b) {
				t.Errorf("storage.links[%d] (%s): not a hard link to %s (%v, %v)", i, l.Path, *l.Target, errA, errB)
			}
			continue
		}
		if got, err := os.Readlink(p); err != nil || got != *l.Target {
			t.Errorf("storage.links[%d] (%s) -> %q (%v), want %q", i, l.Path, got, err, *l.Target)
		}
	}
}

// checkOwner checks that fi is owned by the user and group an entry names (root when it
// names none).
func checkOwner(t *testing.T, what string, fi fs.FileInfo, user, group config.Owner, acc *accounts) {
	t.Helper()
	want := func(o config.Owner, byName func(string) (int, bool)) int {
		switch {
		case o.ID != nil:
			return *o.ID
		case o.Name != "":
			id, ok := byName(o.Name)
			if !ok {
				t.Errorf("%s: owner %q does not exist", what, o.Name)
			}
			return id
		}
		return 0
	}
	uid := want(user, func(n string) (int, bool) { u, ok := acc.users[n]; return u.UID, ok })
	gid := want(group, func(n string) (int, bool) { g, ok := acc.groups[n]; return g.GID, ok })
	st := fi.Sys().(*syscall.Stat_t)
	if int(st.Uid) != uid || int(st.Gid) != gid {
		t.Errorf("%s: owned by %d:%d, want %d:%d", what, st.Uid, st.Gid, uid, gid)
	}
}

// checkAppliedUnits checks the config's units and drop-ins under root's
// /etc/systemd/system, and that enabled units are wanted and masked ones masked.
func checkAppliedUnits(t *testing.T, root string, units []types.Unit) {
	t.Helper()
	dir := filepath.Join(root, "etc", "systemd", "system")
	for _, u := range units {
		p := filepath.Join(dir, u.Name)
		if u.Mask != nil && *u.Mask {
			if got, _ := os.Readlink(p); got != "/dev/null" {
				t.Errorf("unit %s is not masked (-> %q)", u.Name, got)
			}
			continue
		}
		if u.Contents != nil {
			if data, err := os.ReadFile(p); err != nil || string(data) != *u.Contents {
				t.Errorf("unit %s: %q, %v; want the config's contents", u.Name, data, err)
			}
		}
		for _, d := range u.Dropins {
			data, err := os.ReadFile(filepath.Join(dir, u.Name+".d", d.Name))
			if err != nil || (d.Contents != nil && string(data) != *d.Contents) {
				t.Errorf("unit %s drop-in %s: %q, %v", u.Name, d.Name, data, err)
			}
		}
		if u.Enabled != nil && *u.Enabled {
			wants, _ := filepath.Glob(filepath.Join(dir, "*.wants", u.Name))
			requires, _ := filepath.Glob(filepath.Join(dir, "*.requires", u.Name))
			if len(wants)+len(requires) == 0 {
				t.Errorf("unit %s is not enabled: no *.wants/%s or *.requires/%s", u.Name, u.Name, u.Name)
			}
		}
	}
}
