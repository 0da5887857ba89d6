package firstboot

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/kilnproject/kiln/initd/config"
	"github.com/kilnproject/kiln/initd/source"
	"github.com/kilnproject/kiln/initd/task"
	"github.com/kilnproject/kiln/internal/testkit"
)

// nodeRoot is a minimal node of a Kubernetes role: imageRoot with the role's templates the
// bake puts at /usr/lib/kiln/templates.
func nodeRoot(t *testing.T, role string) string {
	t.Helper()
	root := imageRoot(t, role)
	_, file, _, _ := runtime.Caller(0)
	repo := filepath.Join(filepath.Dir(file), "..", "..")
	out, err := exec.Command("cp", "-a", filepath.Join(repo, "profiles/templates", role), filepath.Join(root, "usr/lib/kiln/templates")).CombinedOutput()
	if err != nil {
		os.MkdirAll(filepath.Join(root, "usr/lib/kiln"), 0o755)
		out, err = exec.Command("cp", "-a", filepath.Join(repo, "profiles/templates", role), filepath.Join(root, "usr/lib/kiln/templates")).CombinedOutput()
	}
	if err != nil {
		t.Fatalf("copy templates: %v: %s", err, out)
	}
	return root
}

// imageRoot is a minimal node baked for role: account databases, a unit directory and
// image.json.
func imageRoot(t *testing.T, role string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("creating users with useradd --root needs root")
	}
	if _, err := exec.LookPath("useradd"); err != nil {
		t.Skip("useradd not installed")
	}
	root := t.TempDir()
	for p, data := range map[string]string{
		"etc/passwd":          "root:x:0:0:root:/root:/bin/bash\n",
		"etc/group":           "root:x:0:\nadm:x:4:\n",
		"etc/shadow":          "root:*:19000:0:99999:7:::\n",
		"etc/gshadow":         "root:*::\nadm:*::\n",
		"etc/kiln/image.json": `{"name":"qemu","role":"` + role + `","platform":"qemu"}`,
	} {
		mustWrite(t, filepath.Join(root, p), data)
	}
	for _, d := range []string{"usr/lib/systemd/system", "home", "root"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

const fullConfig = `variant: fcos
version: 1.6.0
passwd:
  users:
    - name: ops
      groups: [adm]
      ssh_authorized_keys:
        - ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHk3Lq1o7tJ8VdBHrS1a2Wm9QeHh3hQk4b0aL8cY0fJ9 ops@example
storage:
  directories:
    - path: /var/lib/demo
      mode: 0750
  files:
    - path: /etc/kiln/node.yaml
      contents:
        inline: |
          cluster: {name: demo, dnsZone: example.com}
          role: worker
          hostname: worker-1
    - path: /etc/demo.conf
      mode: 0600
      contents:
        inline: secret=1
  links:
    - path: /etc/demo-link.conf
      target: /etc/demo.conf
systemd:
  units:
    - name: demo.service
      enabled: true
      contents: |
        [Service]
        ExecStart=/bin/true
        [Install]
        WantedBy=multi-user.target
`

// firstbootState is what two runs of first boot must leave alike below root: every file
// and symlink but the status file each run writes.
func firstbootState(t *testing.T, root string) testkit.Tree {
	t.Helper()
	tree := testkit.Snapshot(t, root)
	for p, n := range tree {
		if n.Mode.IsDir() || p == "var/lib/kiln/status.json" {
			delete(tree, p)
		}
	}
	return tree
}

// sameAfterRerun reports whether a rerun left a file's content, mode and modification
// time, or a symlink's target, as they were.
func sameAfterRerun(a, b testkit.Node) bool {
	return testkit.SameContent(a, b) && (a.Mode&fs.ModeSymlink != 0 || a.MTime.Equal(b.MTime))
}

// checkRerun runs first boot again, forced, with the node config cfg, and fails the test
// unless every task is unchanged and no file or symlink below root changed or appeared.
func checkRerun(t *testing.T, root string, opts Options, cfg string) {
	t.Helper()
	before := firstbootState(t, root)
	opts.Force = true
	opts.Providers = []source.Provider{fwcfg(t, cfg)}
	st, err := Run(context.Background(), opts)
	if err != nil {
		t.Fatalf("second run: %v", err)
	}
	for _, tk := range st.Tasks {
		if tk.State != task.StateUnchanged {
			t.Errorf("second run: task %s %s %s", tk.Name, tk.State, tk.Error)
		}
	}
	if d := before.Diff(firstbootState(t, root), sameAfterRerun); len(d) > 0 {
		t.Errorf("second run changed:\n%s", strings.Join(d, "\n"))
	}
}

// The whole first boot on a node root: users, directories, files, links, units, node config,
// facts, hostname, preflight and the role's templates; then a forced re-run changes nothing,
// byte for byte and mtime for mtime.
func TestRunWholeGraphIsIdempotent(t *testing.T) {
	root := nodeRoot(t, "worker")
	var calls []string
	opts := Options{
		Root:      root,
		Providers: []source.Provider{fwcfg(t, fullConfig)},
		Systemctl: func(_ context.Context, args ...string) error {
			calls = append(calls, strings.Join(args, " "))
			return nil
		},
		// This sandbox is not a node: its cgroup hierarchy and tools are the host's.
		PreflightIgnore: []string{"cgroup-v2", "path-iptables", "path-ip", "path-nsenter", "swap", "port-10250"},
		Notify:          func(string) error { return nil },
	}
	st, err := Run(context.Background(), opts)
	if err != nil {
		t.Fatalf("first boot: %v\n%+v", err, st.Tasks)
	}
	for _, tk := range st.Tasks {
		if tk.State != task.StateApplied && tk.State != task.StateUnchanged {
			t.Errorf("task %s: %s %s", tk.Name, tk.State, tk.Error)
		}
	}
	if st.Hostname != "worker-1" || st.Role != "worker" || st.Source != "fw_cfg" {
		t.Errorf("status hostname=%q role=%q source=%q", st.Hostname, st.Role, st.Source)
	}
	for p, want := range map[string]string{
		"etc/hostname":                       "worker-1\n",
		"etc/demo.conf":                      "secret=1",
		"home/ops/.ssh/authorized_keys":      "ops@example",
		"etc/kubernetes/kubelet-config.yaml": "cgroupDriver: systemd",
	} {
		b, err := os.ReadFile(filepath.Join(root, p))
		if err != nil || !strings.Contains(string(b), want) {
			t.Errorf("%s = %q, %v; want it to contain %q", p, b, err, want)
		}
	}
	if fi, err := os.Stat(filepath.Join(root, "etc/demo.conf")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("secret file mode: %v %v", fi.Mode(), err)
	}
	if target, err := os.Readlink(filepath.Join(root, "etc/systemd/system/multi-user.target.wants/demo.service")); err != nil || target != "/etc/systemd/system/demo.service" {
		t.Errorf("demo.service enablement link -> %q, %v", target, err)
	}
	if !slices.Contains(calls, "daemon-reload") || !slices.Contains(calls, "start --no-block -- demo.service") {
		t.Errorf("systemctl calls %v: want a daemon-reload and the enabled unit started", calls)
	}

	calls = nil
	checkRerun(t, root, opts, fullConfig)
}

// A node config for another role than the image's stops first boot with a clear error.
func TestRunRefusesForeignRole(t *testing.T) {
	root := nodeRoot(t, "worker")
	cfg := `{"ignition":{"version":"3.4.0"},"storage":{"files":[{"path":"/etc/kiln/node.yaml","contents":{"source":"data:,cluster%3A%20%7Bname%3A%20demo%2C%20dnsZone%3A%20example.com%7D%0Arole%3A%20control-plane%0Aetcd%3A%20%7Bmember%3A%20a%2C%20members%3A%20%5Ba%5D%7D%0A"}}]}}`
	st, err := Run(context.Background(), Options{Root: root, Providers: []source.Provider{fwcfg(t, cfg)},
		Systemctl: func(context.Context, ...string) error { return nil }, Notify: func(string) error { return nil }})
	if err == nil || !strings.Contains(err.Error(), "role control-plane, but this image was baked for worker") {
		t.Fatalf("Run = %v", err)
	}
	if !strings.HasPrefix(st.Line(), "kiln-init: firstboot failed: ") {
		t.Errorf("Line = %q", st.Line())
	}
}

// plainConfig is a plain node's config: an account, a file, the hostname and a unit.
const plainConfig = `variant: fcos
version: 1.6.0
passwd:
  users:
    - name: ops
storage:
  files:
    - path: /etc/hostname
      contents: {inline: "edge-1\n"}
    - path: /etc/demo.conf
      contents: {inline: "demo=1\n"}
systemd:
  units:
    - name: demo.service
      enabled: true
      contents: "[Service]\nExecStart=/bin/true\n[Install]\nWantedBy=multi-user.target\n"
`

// plainTasks are a plain node's first boot: the Ignition config and the node's facts and
// hostname, no Kubernetes task.
var plainTasks = []string{"storage", "users", "directories", "files", "network", "links", "units", "systemd", "node-config", "facts", "hostname"}

// An image baked for a role that is not Kubernetes' (any profile name but worker,
// control-plane and etcd) is a plain node: first boot applies its config and runs no
// Kubernetes task; a node config there is an error naming the file and the field.
func TestRunPlainImage(t *testing.T) {
	for _, tc := range []struct {
		name, role, nodeYAML string
		wantErr              []string // substrings of the error; none: first boot succeeds
	}{
		{name: "plain", role: "plain"},
		{name: "any role name", role: "edge-gateway"},
		{name: "node config for a worker", role: "plain", nodeYAML: "cluster: {name: demo}\nrole: worker\napiEndpoint: 192.0.2.10:6443\n",
			wantErr: []string{"/etc/kiln/node.yaml: role worker: ", "baked for plain, a node without Kubernetes"}},
		{name: "node config naming the image's role", role: "plain", nodeYAML: "cluster: {name: demo}\nrole: plain\n",
			wantErr: []string{"etc/kiln/node.yaml:2: role: ", "baked for plain, a node without Kubernetes"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := imageRoot(t, tc.role)
			cfg := plainConfig
			if tc.nodeYAML != "" {
				cfg = strings.Replace(cfg, "  files:\n", "  files:\n    - path: /etc/kiln/node.yaml\n      contents: {inline: "+strconv.Quote(tc.nodeYAML)+"}\n", 1)
			}
			st, err := Run(context.Background(), Options{Root: root, Providers: []source.Provider{fwcfg(t, cfg)},
				Systemctl: func(context.Context, ...string) error { return nil }, Notify: func(string) error { return nil }})
			if len(tc.wantErr) > 0 {
				assertPlainRefused(t, st, err, tc.wantErr)
				return
			}
			assertPlainNode(t, root, st, err, tc.role)
		})
	}
}

// assertPlainRefused checks a first boot failed with an error holding every one of want.
func assertPlainRefused(t *testing.T, st *Status, err error, want []string) {
	t.Helper()
	for _, w := range want {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Fatalf("Run = %v, want an error containing %q", err, w)
		}
	}
	if !strings.HasPrefix(st.Line(), "kiln-init: firstboot failed: ") {
		t.Errorf("Line = %q", st.Line())
	}
}

// assertPlainNode checks a plain node's first boot succeeded, applied its config and ran
// no Kubernetes task.
func assertPlainNode(t *testing.T, root string, st *Status, err error, role string) {
	t.Helper()
	if err != nil {
		t.Fatalf("first boot of a plain node: %v\n%+v", err, st.Tasks)
	}
	var names []string
	for _, tk := range st.Tasks {
		names = append(names, tk.Name)
	}
	slices.Sort(names)
	if want := slices.Sorted(slices.Values(plainTasks)); !slices.Equal(names, want) {
		t.Errorf("tasks %v, want %v", names, want)
	}
	if !strings.HasPrefix(st.Line(), "kiln-init: firstboot ok ") || st.Role != role || st.Hostname != "edge-1" {
		t.Errorf("Line = %q, role %q, hostname %q", st.Line(), st.Role, st.Hostname)
	}
	for p, want := range map[string]string{"etc/hostname": "edge-1\n", "etc/demo.conf": "demo=1\n"} {
		if b, err := os.ReadFile(filepath.Join(root, p)); err != nil || string(b) != want {
			t.Errorf("%s = %q, %v; want %q", p, b, err, want)
		}
	}
	if _, err := os.Lstat(filepath.Join(root, "etc/systemd/system/multi-user.target.wants/demo.service")); err != nil {
		t.Errorf("demo.service not enabled: %v", err)
	}
	if exists(root, "etc/kubernetes") {
		t.Error("a plain node got /etc/kubernetes")
	}
}

// A config that writes systemd-networkd files gets them applied in this boot (networkd
// started before first boot and does not watch its directory); one that does not, does not
// touch the network.
func TestNetworkFilesAreReloaded(t *testing.T) {
	for _, tc := range []struct {
		name, path string
		reload     bool
	}{
		{"network file", "/etc/systemd/network/10-static.network", true},
		{"other file", "/etc/demo.conf", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := nodeRoot(t, "worker")
			var calls []string
			cfg := fmt.Sprintf("variant: fcos\nversion: 1.6.0\nstorage:\n  files:\n    - path: %s\n      contents: {inline: \"[Match]\\nName=enp0s16\\n\"}\n", tc.path)
			_, err := Run(context.Background(), Options{
				Root:      root,
				Providers: []source.Provider{fwcfg(t, cfg)},
				Systemctl: func(context.Context, ...string) error { return nil },
				Networkctl: func(_ context.Context, args ...string) (string, error) {
					calls = append(calls, strings.Join(args, " "))
					if len(calls) < 3 {
						return "2 enp0s16 ether routable configuring\n", nil
					}
					return "2 enp0s16 ether routable configured\n", nil
				},
				PreflightIgnore: []string{"cgroup-v2", "path-iptables", "path-ip", "path-nsenter", "swap", "port-10250"},
				Notify:          func(string) error { return nil },
			})
			if err != nil {
				t.Fatal(err)
			}
			if got := len(calls) > 0 && calls[0] == "reload"; got != tc.reload {
				t.Fatalf("networkctl calls %q: want reload=%v", calls, tc.reload)
			}
			if tc.reload && calls[len(calls)-1] != "list --no-legend --no-pager" || tc.reload && len(calls) != 3 {
				t.Errorf("networkctl calls %q: want a reload, then lists until no link is configuring", calls)
			}
		})
	}
}

// The plan's tasks, in order, with the dependencies each declares: the graph drawn in
// plan's doc comment.
func TestPlanGraph(t *testing.T) {
	want := []struct {
		name string
		deps []string
	}{
		{"storage", nil},
		{"users", []string{"storage"}},
		{"directories", []string{"users"}},
		{"files", []string{"storage", "users", "directories"}},
		{"network", []string{"files"}},
		{"links", []string{"files"}},
		{"units", []string{"files", "links"}},
		{"systemd", []string{"units"}},
		{"node-config", []string{"files"}},
		{"facts", []string{"node-config", "network"}},
		{"hostname", []string{"facts"}},
		{"preflight", []string{"facts", "hostname"}},
		{"render", []string{"preflight", "node-config", "etcd-join"}},
		{"etcd-volume", []string{"preflight"}},
		{"etcd-join", []string{"pki", "etcd-volume"}},
		{"etcd-manifest", []string{"render", "etcd-volume"}},
		{"pki", []string{"preflight"}},
		{"containerd-store", []string{"storage"}},
		{"kubelet", []string{"render", "pki", "etcd-manifest", "containerd-store"}},
	}
	got := newPlan(Options{}, &config.Config{}, "").tasks()
	if len(got) != len(want) {
		t.Fatalf("%d tasks, want %d", len(got), len(want))
	}
	for i, w := range want {
		if got[i].Name() != w.name || !slices.Equal(got[i].Deps(), w.deps) {
			t.Errorf("task %d: %s after %v, want %s after %v", i, got[i].Name(), got[i].Deps(), w.name, w.deps)
		}
	}
	if _, err := task.Order(got); err != nil {
		t.Errorf("the graph does not order: %v", err)
	}
}
