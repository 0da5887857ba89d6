package render

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/kilnproject/kiln/initd/firstboot/facts"
)

var update = flag.Bool("update", false, "rewrite testdata/golden from the templates")

// templates is the repository's profile templates directory.
const templates = "../../../profiles/templates"

// fixedData is the node every golden file is rendered for.
func fixedData(role string) Data {
	d := Data{
		Role: role,
		Facts: facts.Facts{
			Hostname: "node-1", HostnameSource: facts.FromConfig,
			Interface: "eth0", IPv4: "10.0.0.11", IPv6: "fd00::11",
			MACs:     map[string]string{"eth0": "52:54:00:12:34:56"},
			Platform: "aws", InstanceID: "i-0123456789abcdef0", Zone: "eu-west-1a", Region: "eu-west-1",
			MachineID: "3d1219c7c4c5404aaa1f6d2a48adfda4", CPUs: 2, MemoryMB: 3900,
			KernelVersion: "6.1.0-40-cloud-amd64", CgroupV2: true,
		},
		Node:        Node{ClusterName: "demo"},
		Nameservers: []string{"10.0.0.2"},
	}
	d.Node.Kubernetes.NodeLabels = map[string]string{"example.com/pool": "general"}
	d.Node.Kubernetes.FeatureGates = map[string]bool{"UserNamespacesSupport": true}
	d.Node.Kubernetes.LeaderElection = LeaderElection{LeaseDuration: "60s", RenewDeadline: "40s", RetryPeriod: "5s"}
	if role == "control-plane" {
		// Three stacked members found by their DNS names, as kiln cluster init
		// --control-planes 3 makes them.
		d.Node.Etcd.Name = "a"
		for _, m := range []string{"a", "b", "c"} {
			d.Node.Etcd.Members = append(d.Node.Etcd.Members,
				Member{Name: m, PeerURL: "https://etcd-" + m + ".internal.demo.example.test:2380"})
		}
		d.Node.Etcd.PeerURL = d.Node.Etcd.Members[0].PeerURL
		// The Raft timings of kiln cluster init --slow-control-plane; the etcd role keeps etcd's.
		d.Node.Etcd.HeartbeatMS, d.Node.Etcd.ElectionMS = 500, 5000
	}
	if role == "control-plane-external-etcd" {
		// The external topology: the API server uses three etcd nodes' members.
		d.Role = "control-plane"
		d.Node.Etcd.External = true
		for _, m := range []string{"a", "b", "c"} {
			d.Node.Etcd.Servers = append(d.Node.Etcd.Servers, "https://etcd-"+m+".internal.demo.example.test:2379")
		}
	}
	if role == "etcd" {
		d.Node.Etcd.Members = []Member{
			{Name: "node-1", PeerURL: "https://10.0.0.11:2380"},
			{Name: "node-2", PeerURL: "https://10.0.0.12:2380"},
			{Name: "node-3", PeerURL: "https://10.0.0.13:2380"},
		}
	}
	return d
}

// tree lists the files below dir as "mode path" lines, and their contents.
func tree(t *testing.T, dir string) (modes []string, contents map[string][]byte) {
	t.Helper()
	contents = map[string][]byte{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		modes = append(modes, fmt.Sprintf("%04o /%s", fi.Mode().Perm(), rel))
		contents[rel], err = os.ReadFile(p)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return modes, contents
}

func TestGolden(t *testing.T) {
	// Each case is a golden directory: the role templates it renders and the node they are
	// rendered for (fixedData).
	for _, c := range []struct{ role, templates string }{
		{"worker", "worker"}, {"control-plane", "control-plane"}, {"etcd", "etcd"},
		{"control-plane-external-etcd", "control-plane"},
	} {
		role := c.role
		t.Run(role, func(t *testing.T) {
			root := t.TempDir()
			changed, err := Render(filepath.Join(templates, c.templates), root, fixedData(role))
			if err != nil {
				t.Fatalf("Render: %v", err)
			}
			modes, got := tree(t, root)
			if len(changed) != len(got) {
				t.Errorf("changed = %v, but %d files were written", changed, len(got))
			}
			golden := filepath.Join("testdata/golden", role)
			modesFile := filepath.Join("testdata/golden", role+".modes")
			if *update {
				os.RemoveAll(golden)
				for rel, data := range got {
					p := filepath.Join(golden, rel)
					if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
						t.Fatal(err)
					}
					if err := os.WriteFile(p, data, 0o644); err != nil {
						t.Fatal(err)
					}
				}
				if err := os.WriteFile(modesFile, []byte(strings.Join(modes, "\n")+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			_, want := tree(t, golden)
			for rel := range want {
				if _, ok := got[rel]; !ok {
					t.Errorf("%s: in the golden files, not rendered", rel)
				}
			}
			for rel, data := range got {
				if w, ok := want[rel]; !ok {
					t.Errorf("%s: rendered, not in the golden files (run go test -update)", rel)
				} else if !bytes.Equal(data, w) {
					t.Errorf("%s differs from %s (run go test -update and review the diff):\n%s", rel, filepath.Join(golden, rel), data)
				}
			}
			wantModes, err := os.ReadFile(modesFile)
			if err != nil {
				t.Fatal(err)
			}
			if g := strings.Join(modes, "\n") + "\n"; g != string(wantModes) {
				t.Errorf("modes:\n%s\nwant (%s):\n%s", g, modesFile, wantModes)
			}
			for rel, data := range got {
				checkSyntax(t, rel, data)
			}
		})
	}
}

// checkSyntax parses what can be parsed: YAML documents must be Kubernetes objects
// (apiVersion and kind) or crictl's flat map; systemd units must be sections of
// Key=Value lines; TOML gets a shape check (no parser among kiln's modules).
func checkSyntax(t *testing.T, rel string, data []byte) {
	t.Helper()
	switch {
	case strings.HasPrefix(rel, "etc/kubernetes/addons/"):
		// Addons are multi-document streams of objects kiln-init applies.
		dec := yaml.NewDecoder(bytes.NewReader(data))
		for n := 1; ; n++ {
			var doc map[string]any
			if err := dec.Decode(&doc); err != nil {
				if err != io.EOF {
					t.Errorf("%s: document %d: YAML: %v", rel, n, err)
				}
				break
			}
			md, _ := doc["metadata"].(map[string]any)
			if doc["apiVersion"] == nil || doc["kind"] == nil || md["name"] == nil {
				t.Errorf("%s: document %d: no apiVersion, kind or metadata.name", rel, n)
			}
		}
	case strings.HasSuffix(rel, ".yaml"), strings.HasSuffix(rel, ".manifest"):
		var doc map[string]any
		if err := yaml.Unmarshal(data, &doc); err != nil {
			t.Errorf("%s: YAML: %v", rel, err)
			return
		}
		if rel == "etc/crictl.yaml" {
			if doc["runtime-endpoint"] != "unix:///run/containerd/containerd.sock" {
				t.Errorf("%s: runtime-endpoint = %v", rel, doc["runtime-endpoint"])
			}
			return
		}
		if doc["apiVersion"] == nil || doc["kind"] == nil {
			t.Errorf("%s: no apiVersion or kind", rel)
		}
		if doc["kind"] == "Pod" {
			spec := doc["spec"].(map[string]any)
			if spec["hostNetwork"] != true || spec["priorityClassName"] != "system-node-critical" ||
				doc["metadata"].(map[string]any)["namespace"] != "kube-system" {
				t.Errorf("%s: a static pod must be hostNetwork, system-node-critical, in kube-system", rel)
			}
		}
	case strings.HasSuffix(rel, ".conf"):
		sc := bufio.NewScanner(bytes.NewReader(data))
		for n := 1; sc.Scan(); n++ {
			l := sc.Text()
			if l == "" || l[0] == '#' || l[0] == '[' && strings.HasSuffix(l, "]") || strings.Contains(l, "=") {
				continue
			}
			t.Errorf("%s:%d: not a systemd unit line: %q", rel, n, l)
		}
	case strings.HasSuffix(rel, ".toml"):
		sc := bufio.NewScanner(bytes.NewReader(data))
		for n := 1; sc.Scan(); n++ {
			l := strings.TrimSpace(sc.Text())
			if l == "" || l[0] == '#' || l[0] == '[' && strings.HasSuffix(l, "]") || strings.Count(l, " = ") == 1 {
				continue
			}
			t.Errorf("%s:%d: not a TOML line: %q", rel, n, l)
		}
	default:
		t.Errorf("%s: no syntax check for this kind of file", rel)
	}
}

// TestRenderIdempotent: a second render with the same data writes nothing and keeps
// every mtime; changed data rewrites exactly the files whose content changes.
func TestRenderIdempotent(t *testing.T) {
	src := filepath.Join(templates, "control-plane")
	root := t.TempDir()
	data := fixedData("control-plane")
	if _, err := Render(src, root, data); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-time.Hour).Truncate(time.Second)
	filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			os.Chtimes(p, old, old)
		}
		return err
	})
	changed, err := Render(src, root, data)
	if err != nil || changed != nil {
		t.Fatalf("second Render = %v, %v; want nothing changed", changed, err)
	}
	fi, _ := os.Stat(filepath.Join(root, "etc/kubernetes/manifests/kube-apiserver.yaml"))
	if !fi.ModTime().Equal(old) {
		t.Errorf("mtime changed on an unchanged file: %v", fi.ModTime())
	}

	data.Node.Kubernetes.Version = "v1.37.3"
	changed, err = Render(src, root, data)
	want := []string{
		"/etc/kubernetes/addons/kube-proxy.yaml",
		"/etc/kubernetes/manifests/kube-apiserver.yaml",
		"/etc/kubernetes/manifests/kube-controller-manager.yaml",
		"/etc/kubernetes/manifests/kube-scheduler.yaml",
	}
	if err != nil || !reflect.DeepEqual(changed, want) {
		t.Fatalf("Render after a version bump = %v, %v; want %v", changed, err, want)
	}

	// A mode someone loosened is put back.
	p := filepath.Join(root, "etc/kubernetes/etcd/etcd.manifest")
	os.Chmod(p, 0o644)
	changed, err = Render(src, root, data)
	if err != nil || !reflect.DeepEqual(changed, []string{"/etc/kubernetes/etcd/etcd.manifest"}) {
		t.Fatalf("Render after chmod = %v, %v", changed, err)
	}
	if fi, _ := os.Stat(p); fi.Mode().Perm() != 0o600 {
		t.Errorf("etcd.manifest mode %o, want 0600", fi.Mode().Perm())
	}
}

// writeTemplates makes a template directory from path → content (mode 0644).
func writeTemplates(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for p, s := range files {
		p = filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestRenderErrors(t *testing.T) {
	tests := []struct {
		name  string
		files map[string]string
		want  string
	}{
		{"unknown field", map[string]string{"etc/a.tmpl": "ok\n{{.Node.Kubernetes.Versoin}}\n"},
			"template: etc/a.tmpl:2:7: executing \"etc/a.tmpl\" at <.Node.Kubernetes.Versoin>: can't evaluate field Versoin"},
		{"missing map key", map[string]string{"etc/a.tmpl": "{{.Node.Kubernetes.FeatureGates.Nope}}"},
			`etc/a.tmpl:1:7: executing "etc/a.tmpl" at <.Node.Kubernetes.FeatureGates.Nope>: map has no entry for key "Nope"`},
		{"required", map[string]string{"x.tmpl": "\n\n{{required \"the node has no IP address\" .Facts.IPv6}}"},
			"x.tmpl:3:2: executing \"x.tmpl\" at <required \"the node has no IP address\" .Facts.IPv6>: error calling required: the node has no IP address"},
		{"syntax", map[string]string{"x.tmpl": "{{if}}"}, "x.tmpl:1: missing value for if"},
		{"not a template", map[string]string{"a.tmpl": "", "README": "hi"}, "README is not a template (no .tmpl suffix)"},
		{"empty", map[string]string{}, "no templates in"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			src := writeTemplates(t, tc.files)
			root := t.TempDir()
			data := fixedData("worker")
			data.Facts.IPv6 = ""
			changed, err := Render(src, root, data)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Render error = %v\nwant it to contain %q", err, tc.want)
			}
			if changed != nil {
				t.Errorf("changed = %v after an error", changed)
			}
			if ents, _ := os.ReadDir(root); len(ents) != 0 {
				t.Errorf("Render wrote %v before failing; it must be all or nothing", ents)
			}
		})
	}
}

func TestRenderModes(t *testing.T) {
	src := writeTemplates(t, map[string]string{
		"etc/plain.conf.tmpl":           "a={{.Role}}\n",
		"etc/secret.tmpl":               "{{- /* kiln:mode 0600 */ -}}\ntoken\n",
		"etc/kubernetes/pki/extra.tmpl": "key\n",
		"usr/local/bin/hook.tmpl":       "#!/bin/sh\n",
	})
	os.Chmod(filepath.Join(src, "usr/local/bin/hook.tmpl"), 0o775)
	root := t.TempDir()
	changed, err := Render(src, root, fixedData("worker"))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"/etc/kubernetes/pki/extra", "/etc/plain.conf", "/etc/secret", "/usr/local/bin/hook"}
	if !reflect.DeepEqual(changed, want) {
		t.Errorf("changed = %v, want %v", changed, want)
	}
	modes, contents := tree(t, root)
	wantModes := []string{"0600 /etc/kubernetes/pki/extra", "0644 /etc/plain.conf", "0600 /etc/secret", "0755 /usr/local/bin/hook"}
	if !reflect.DeepEqual(modes, wantModes) {
		t.Errorf("modes = %v, want %v", modes, wantModes)
	}
	if string(contents["etc/secret"]) != "token\n" || string(contents["etc/plain.conf"]) != "a=worker\n" {
		t.Errorf("contents = %q", contents)
	}
	if ents, _ := os.ReadDir(filepath.Join(root, "etc")); slices.ContainsFunc(ents, func(e fs.DirEntry) bool { return strings.HasPrefix(e.Name(), ".kiln-") }) {
		t.Errorf("temporary files left behind: %v", ents)
	}
}

// TestRenderStaysInRoot: a symlink pointing out of the root is an error, never a write
// outside it; a symlink in a file's place is not written through.
func TestRenderStaysInRoot(t *testing.T) {
	src := writeTemplates(t, map[string]string{"etc/kubernetes/a.yaml.tmpl": "a: 1\n"})
	for _, tc := range []struct {
		name  string
		setup func(root, outside string)
	}{
		{"directory link to an absolute path", func(root, outside string) {
			os.Symlink(outside, filepath.Join(root, "etc"))
		}},
		{"directory link climbing out", func(root, outside string) {
			rel, _ := filepath.Rel(root, outside)
			os.Symlink(rel, filepath.Join(root, "etc"))
		}},
		{"file link", func(root, outside string) {
			os.MkdirAll(filepath.Join(root, "etc/kubernetes"), 0o755)
			os.Symlink(filepath.Join(outside, "a.yaml"), filepath.Join(root, "etc/kubernetes/a.yaml"))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root, outside := t.TempDir(), t.TempDir()
			tc.setup(root, outside)
			if _, err := Render(src, root, fixedData("worker")); err == nil {
				t.Error("Render through a symlink out of the root: no error")
			}
			if ents, _ := os.ReadDir(outside); len(ents) != 0 {
				t.Errorf("Render wrote outside the root: %v", ents)
			}
		})
	}
}

func TestWithDefaults(t *testing.T) {
	d := Data{Role: "control-plane", Facts: facts.Facts{Hostname: "cp-1", IPv6: "fd00::5"}}
	got := d.withDefaults()
	if got.Node.Etcd.InitialCluster() != "cp-1=https://[fd00::5]:2380" {
		t.Errorf("InitialCluster = %q", got.Node.Etcd.InitialCluster())
	}
	if got.Node.Kubernetes.Version != DefaultKubernetesVersion || got.Node.Runtime.SandboxImage != defaultSandboxImage ||
		got.Node.Etcd.Version != defaultEtcdVersion || got.Node.ClusterName != "kubernetes" {
		t.Errorf("defaults: %+v", got.Node)
	}
	if again := got.withDefaults(); !reflect.DeepEqual(again, got) {
		t.Errorf("WithDefaults is not idempotent:\n%+v\n%+v", again, got)
	}
	if got.NodeLabels() != "kiln.dev/role=control-plane" {
		t.Errorf("NodeLabels = %q", got.NodeLabels())
	}
	got.Node.Kubernetes.FeatureGates["A"] = true
	if len(d.Node.Kubernetes.FeatureGates) != 0 {
		t.Error("WithDefaults shares maps with its receiver")
	}
}

func TestFuncs(t *testing.T) {
	src := writeTemplates(t, map[string]string{"out.tmpl": `{{quote "a \"b\"\n<c>"}}
{{join "," .Node.Etcd.Servers}}
{{toYAML .Node.Etcd.Members | indent 2}}
{{default "x" ""}} {{default "x" "y"}}
{{hostPort "fd00::1" 6443}} {{hostPort .Facts.IPv4 6443}}
`})
	root := t.TempDir()
	if _, err := Render(src, root, fixedData("etcd")); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(filepath.Join(root, "out"))
	want := `"a \"b\"\n<c>"
https://127.0.0.1:2379
  - name: node-1
    peerurl: https://10.0.0.11:2380
  - name: node-2
    peerurl: https://10.0.0.12:2380
  - name: node-3
    peerurl: https://10.0.0.13:2380
x y
[fd00::1]:6443 10.0.0.11:6443
`
	if string(got) != want {
		t.Errorf("got:\n%s\nwant:\n%s", got, want)
	}
}

// A node without an upstream name server (offline) gets a Corefile without the forward
// plugin: CoreDNS would refuse to start with it.
func TestCorefileWithoutUpstream(t *testing.T) {
	for _, ns := range [][]string{{"10.0.0.2"}, nil} {
		d := fixedData("control-plane")
		d.Nameservers = ns
		root := t.TempDir()
		if _, err := Render(filepath.Join(templates, "control-plane"), root, d); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(root, "etc/kubernetes/addons/coredns.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Contains(string(b), "forward . /etc/resolv.conf"); got != (len(ns) > 0) {
			t.Errorf("nameservers %v: Corefile forwards = %t:\n%s", ns, got, b)
		}
		if !strings.Contains(string(b), "kubernetes cluster.local in-addr.arpa ip6.arpa") {
			t.Errorf("nameservers %v: Corefile lost the cluster zone:\n%s", ns, b)
		}
	}
}
