package bake

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kilnproject/kiln/builder/spec"
)

// fakeBin writes a shell script at rel in root that prints out when run.
func fakeBin(t *testing.T, root, rel, out string) {
	t.Helper()
	p := filepath.Join(root, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte("#!/bin/sh\necho '"+out+"'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
}

// What the real binaries print for --version (kubectl: version --client).
const (
	kubelet1372    = "Kubernetes v1.37.2"
	kubectl1372    = "Client Version: v1.37.2\nKustomize Version: v5.7.1"
	containerd242  = "containerd github.com/containerd/containerd/v2 v2.4.2 9a6b1e2c"
	containerdSrc  = "containerd github.com/containerd/containerd/v2 2.4.2+unknown "
	containerd1728 = "containerd containerd.io 1.7.28 b98a3aace656320842a23f4a392a33f46af97866"
	containerd2112 = "containerd github.com/containerd/containerd/v2 v2.1.12 4d3f2a1"
	runc153        = "runc version 1.5.3\ncommit: v1.5.3-0-g1234567\nspec: 1.2.1"
	dockerd        = "Docker version 26.1.5+dfsg1, build a72d7cd"
	criDockerd     = "cri-dockerd 0.3.15 (c1c566e)"
)

func TestCheckVersions(t *testing.T) {
	type bin struct{ rel, out string }
	containerdTree := []bin{{"usr/bin/kubelet", kubelet1372}, {"usr/bin/containerd", containerd242}, {"usr/sbin/runc", runc153}}
	with := func(base []bin, extra ...bin) []bin { return append(append([]bin(nil), base...), extra...) }
	tests := []struct {
		name    string
		k       spec.Kubernetes
		bins    []bin
		symlink [2]string // optional: link name -> target, inside the tree
		want    []string  // substrings of the error; none = accepted
	}{
		{"matching containerd tree", spec.Kubernetes{Version: "v1.37.2", Runtime: "containerd"}, with(containerdTree, bin{"usr/bin/kubectl", kubectl1372}), [2]string{}, nil},
		{"containerd built from source", spec.Kubernetes{Version: "v1.37.2", Runtime: "containerd"},
			[]bin{{"usr/bin/kubelet", kubelet1372}, {"usr/bin/containerd", containerdSrc}, {"usr/sbin/runc", runc153}}, [2]string{}, nil},
		{"kubelet in /usr/local/bin via an absolute symlink", spec.Kubernetes{Version: "v1.37.2", Runtime: "containerd"},
			[]bin{{"opt/k8s/kubelet", kubelet1372}, {"usr/bin/containerd", containerd242}, {"usr/sbin/runc", runc153}}, [2]string{"usr/local/bin/kubelet", "/opt/k8s/kubelet"}, nil},
		{"kubelet of another release", spec.Kubernetes{Version: "v1.37.3", Runtime: "containerd"}, containerdTree, [2]string{},
			[]string{`/usr/bin/kubelet reports v1.37.2 ("Kubernetes v1.37.2") but kubernetes.version is v1.37.3`}},
		{"no kubelet", spec.Kubernetes{Version: "v1.37.2", Runtime: "containerd"}, containerdTree[1:], [2]string{},
			[]string{"kubelet is missing"}},
		{"containerd too old for 1.37", spec.Kubernetes{Version: "v1.37.2", Runtime: "containerd"},
			[]bin{{"usr/bin/kubelet", kubelet1372}, {"usr/bin/containerd", containerd2112}, {"usr/sbin/runc", runc153}}, [2]string{},
			[]string{"/usr/bin/containerd is v2.1.12; Kubernetes v1.37.2 needs containerd v2.2.0 or newer"}},
		{"containerd 1.7.28 for 1.37", spec.Kubernetes{Version: "v1.37.2", Runtime: "containerd"},
			[]bin{{"usr/bin/kubelet", kubelet1372}, {"usr/bin/containerd", containerd1728}, {"usr/sbin/runc", runc153}}, [2]string{},
			[]string{"is v1.7.28; Kubernetes v1.37.2 needs containerd v2.2.0 or newer"}},
		{"containerd 1.7.28 for 1.35", spec.Kubernetes{Version: "v1.35.4", Runtime: "containerd"},
			[]bin{{"usr/bin/kubelet", "Kubernetes v1.35.4"}, {"usr/bin/containerd", containerd1728}, {"usr/sbin/runc", runc153}}, [2]string{}, nil},
		{"containerd 1.7.27 for 1.35", spec.Kubernetes{Version: "v1.35.4", Runtime: "containerd"},
			[]bin{{"usr/bin/kubelet", "Kubernetes v1.35.4"}, {"usr/bin/containerd", "containerd containerd.io 1.7.27 abc"}, {"usr/sbin/runc", runc153}}, [2]string{},
			[]string{"is v1.7.27; Kubernetes v1.35.4 needs containerd v1.7.28 or newer"}},
		{"containerd 2.2.0 for 1.36", spec.Kubernetes{Version: "v1.36.0", Runtime: "containerd"},
			[]bin{{"usr/bin/kubelet", "Kubernetes v1.36.0"}, {"usr/bin/containerd", "containerd github.com/containerd/containerd/v2 v2.2.0 x"}, {"usr/sbin/runc", runc153}}, [2]string{}, nil},
		{"no containerd", spec.Kubernetes{Version: "v1.37.2", Runtime: "containerd"}, []bin{{"usr/bin/kubelet", kubelet1372}, {"usr/sbin/runc", runc153}}, [2]string{},
			[]string{"containerd is missing"}},
		{"no runc", spec.Kubernetes{Version: "v1.37.2", Runtime: "containerd"}, containerdTree[:2], [2]string{},
			[]string{"runc is missing"}},
		{"kubectl two minors behind", spec.Kubernetes{Version: "v1.37.2", Runtime: "containerd"}, with(containerdTree, bin{"usr/bin/kubectl", "Client Version: v1.35.0"}), [2]string{},
			[]string{"/usr/bin/kubectl is v1.35.0, more than one minor release away from kubernetes.version v1.37.2"}},
		{"kubectl one minor ahead", spec.Kubernetes{Version: "v1.37.2", Runtime: "containerd"}, with(containerdTree, bin{"usr/bin/kubectl", "Client Version: v1.38.0"}), [2]string{}, nil},
		{"docker", spec.Kubernetes{Version: "v1.37.2", Runtime: "docker"},
			[]bin{{"usr/bin/kubelet", kubelet1372}, {"usr/bin/dockerd", dockerd}, {"usr/bin/cri-dockerd", criDockerd}, {"usr/bin/containerd", containerd1728}, {"usr/sbin/runc", runc153}}, [2]string{}, nil},
		{"docker without cri-dockerd", spec.Kubernetes{Version: "v1.37.2", Runtime: "docker"},
			[]bin{{"usr/bin/kubelet", kubelet1372}, {"usr/bin/dockerd", dockerd}, {"usr/sbin/runc", runc153}}, [2]string{},
			[]string{"cri-dockerd is missing: kubernetes.runtime docker needs it (kubelet has no dockershim since 1.24)"}},
		{"docker without dockerd", spec.Kubernetes{Version: "v1.37.2", Runtime: "docker"}, containerdTree, [2]string{},
			[]string{"dockerd is missing", "cri-dockerd is missing"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			for _, b := range tt.bins {
				fakeBin(t, root, b.rel, b.out)
			}
			if tt.symlink[0] != "" {
				os.MkdirAll(filepath.Join(root, filepath.Dir(tt.symlink[0])), 0o755)
				if err := os.Symlink(tt.symlink[1], filepath.Join(root, tt.symlink[0])); err != nil {
					t.Fatal(err)
				}
			}
			v, err := ReadVersions(context.Background(), root)
			if err != nil {
				t.Fatal(err)
			}
			err = CheckVersions(tt.k, v)
			if len(tt.want) == 0 {
				if err != nil {
					t.Errorf("refused: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("accepted, want an error with %q", tt.want)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

func TestReadVersionsFailures(t *testing.T) {
	tests := []struct {
		name, script string
		mode         os.FileMode
		want         string
	}{
		{"no version", "#!/bin/sh\necho hello\n", 0o755, `/usr/bin/kubelet: --version printed no version: "hello"`},
		{"fails", "#!/bin/sh\necho boom >&2\nexit 3\n", 0o755, "/usr/bin/kubelet: cannot run it on this host (--version): exit status 3 boom"},
		{"not executable", "#!/bin/sh\necho v1.37.2\n", 0o644, "/usr/bin/kubelet is not executable (mode -rw-r--r--)"},
		{"wrong architecture", "\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xb7\x00", 0o755, "/usr/bin/kubelet: cannot run it on this host (--version): "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			os.MkdirAll(filepath.Join(root, "usr/bin"), 0o755)
			os.WriteFile(filepath.Join(root, "usr/bin/kubelet"), []byte(tt.script), tt.mode)
			_, err := ReadVersions(context.Background(), root)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %v, want %q", err, tt.want)
			}
		})
	}
}

func TestReadVersionsTimeout(t *testing.T) {
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "usr/bin"), 0o755)
	os.WriteFile(filepath.Join(root, "usr/bin/kubelet"), []byte("#!/bin/sh\nexec sleep 60\n"), 0o755)
	start := time.Now()
	_, err := readVersions(context.Background(), root, 300*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "/usr/bin/kubelet: --version did not finish within 300ms") {
		t.Errorf("error %v, want a timeout", err)
	}
	if took := time.Since(start); took > 30*time.Second { // the binary sleeps 60 s
		t.Errorf("a hung binary held the bake for %s", took)
	}
}

func TestCheckKernelArgs(t *testing.T) {
	k137 := spec.Kubernetes{Version: "v1.37.2"}
	k134 := spec.Kubernetes{Version: "v1.34.1"}
	tests := []struct {
		k    spec.Kubernetes
		args []string
		want string
	}{
		{k137, []string{"console=ttyS0,115200", "quiet"}, ""},
		{k137, []string{"cgroup_no_v1=all"}, ""},
		{k137, []string{"systemd.unified_cgroup_hierarchy=1"}, ""},
		{k137, []string{"systemd.unified_cgroup_hierarchy"}, ""},
		{k137, []string{"systemd.legacy_systemd_cgroup_controller=0"}, ""},
		{k137, []string{"systemd.unified_cgroup_hierarchy=0"}, `kernel.args: "systemd.unified_cgroup_hierarchy=0" forces cgroup v1, and kubelet v1.37.2 refuses cgroup v1 (since Kubernetes 1.35): remove it`},
		{k137, []string{"systemd.unified_cgroup_hierarchy=false"}, `"systemd.unified_cgroup_hierarchy=false" forces cgroup v1`},
		{k137, []string{"systemd.legacy_systemd_cgroup_controller"}, `"systemd.legacy_systemd_cgroup_controller" forces cgroup v1`},
		{k137, []string{"systemd.legacy_systemd_cgroup_controller=yes"}, `"systemd.legacy_systemd_cgroup_controller=yes" forces cgroup v1`},
		{spec.Kubernetes{Version: "v1.35.0"}, []string{"systemd.unified_cgroup_hierarchy=no"}, "refuses cgroup v1"},
		{k134, []string{"systemd.unified_cgroup_hierarchy=0"}, ""},
	}
	for _, tt := range tests {
		err := CheckKernelArgs(tt.k, tt.args)
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%s %q: refused: %v", tt.k.Version, tt.args, err)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("%s %q: error %v, want %q", tt.k.Version, tt.args, err, tt.want)
		}
	}
}

// kiln bake -o out gives a relative tree; the binaries still run (they run from another
// working directory).
func TestReadVersionsRelativeRoot(t *testing.T) {
	dir := t.TempDir()
	fakeBin(t, filepath.Join(dir, "tree"), "usr/bin/kubelet", "Kubernetes v1.37.2")
	t.Chdir(dir)
	v, err := ReadVersions(context.Background(), "tree")
	if err != nil {
		t.Fatal(err)
	}
	if v.Kubelet == nil || v.Kubelet.Version != "v1.37.2" {
		t.Fatalf("kubelet version %+v, want v1.37.2", v.Kubelet)
	}
}
