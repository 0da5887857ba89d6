package bake

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/kilnproject/kiln/builder/spec"
)

// goBinaries are the test programs buildGo built, by how they were built; they live in dir for
// the whole test run.
var goBinaries struct {
	sync.Mutex
	dir   string
	built map[string][]byte
}

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "kiln-bake-bins-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	goBinaries.dir, goBinaries.built = dir, map[string][]byte{}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// tinyMain prints a version no test expects: a version read by running a binary shows.
const tinyMain = "package main\n\nimport \"fmt\"\n\nfunc main() { fmt.Println(\"Kubernetes v0.0.1\") }\n"

// goBinary returns a real Go executable built with -ldflags ldflags and the go command's
// flags (the go command records -ldflags in its build information unless -trimpath).
func goBinary(t *testing.T, ldflags string, flags ...string) []byte {
	t.Helper()
	return buildGo(t, "kiln.test/prog", "", append([]string{"-ldflags=" + ldflags}, flags...)...)
}

// goModuleBinary returns a Go executable whose main module is module at tag: built with
// -trimpath from a clean git checkout tagged tag, as a release build from a tag is.
func goModuleBinary(t *testing.T, module, tag string) []byte {
	t.Helper()
	return buildGo(t, module, tag, "-trimpath", "-ldflags=-X k8s.io/component-base/version.gitVersion="+tag)
}

func buildGo(t *testing.T, module, tag string, flags ...string) []byte {
	t.Helper()
	key := module + "@" + tag + " " + strings.Join(flags, "\x00")
	goBinaries.Lock()
	defer goBinaries.Unlock()
	if b, ok := goBinaries.built[key]; ok {
		return b
	}
	src, err := os.MkdirTemp(goBinaries.dir, "src-")
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(src, "go.mod"), []byte("module "+module+"\n\ngo 1.26\n"), 0o644)
	os.WriteFile(filepath.Join(src, "main.go"), []byte(tinyMain), 0o644)
	run := func(name string, args ...string) {
		t.Helper()
		cmd := exec.Command(name, args...)
		cmd.Dir = src
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=", "GOWORK=off",
			"GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.com", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.com")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s %q: %v\n%s", name, args, err, out)
		}
	}
	if tag != "" {
		run("git", "init", "-q")
		run("git", "add", "go.mod", "main.go")
		run("git", "commit", "-q", "-m", "release")
		run("git", "tag", tag)
		flags = append(flags, "-buildvcs=true")
	} else {
		flags = append(flags, "-buildvcs=false")
	}
	out := src + ".bin"
	run("go", append(append([]string{"build", "-o", out}, flags...), ".")...)
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	goBinaries.built[key] = b
	return b
}

// putFile writes an executable with content b at rel in root.
func putFile(t *testing.T, root, rel string, b []byte) {
	t.Helper()
	p := filepath.Join(root, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, b, 0o755); err != nil {
		t.Fatal(err)
	}
}

// fakeBin writes at rel in root a Go executable built with -ldflags ldflags.
func fakeBin(t *testing.T, root, rel, ldflags string) {
	t.Helper()
	putFile(t, root, rel, goBinary(t, ldflags))
}

// The -ldflags of release builds: Kubernetes' hack/lib/version.sh (quoted, both variables),
// containerd's and runc's Makefiles, Debian's docker.io, cri-dockerd's Makefile.
const (
	kubelet1372    = "-s -w -X 'k8s.io/client-go/pkg/version.gitVersion=v1.37.2' -X 'k8s.io/component-base/version.gitVersion=v1.37.2' -X 'k8s.io/component-base/version.gitTreeState=clean'"
	kubectl1372    = "-X k8s.io/client-go/pkg/version.gitVersion=v1.37.2 -X k8s.io/component-base/version.gitVersion=v1.37.2"
	containerd242  = "-s -w -X github.com/containerd/containerd/v2/version.Version=v2.4.2 -X github.com/containerd/containerd/v2/version.Revision=9a6b1e2c"
	containerdSrc  = "-X github.com/containerd/containerd/v2/version.Version=2.4.2+unknown"
	containerd1728 = "-X github.com/containerd/containerd/version.Version=1.7.28 -X github.com/containerd/containerd/version.Package=containerd.io"
	containerd2112 = "-X github.com/containerd/containerd/v2/version.Version=v2.1.12"
	runc153        = "-X main.gitCommit=v1.5.3-0-g1234567 -X main.version=1.5.3 -linkmode internal"
	dockerd        = "-X github.com/docker/docker/dockerversion.Version=26.1.5+dfsg1 -X github.com/docker/docker/dockerversion.GitCommit=a72d7cd"
	dockerd29      = "-X github.com/moby/moby/v2/dockerversion.Version=29.9.0 -X github.com/moby/moby/v2/dockerversion.GitCommit=4e1b3c2"
	dockerdModule  = "-X github.com/moby/moby/v2/dockerversion.Version=2.0.0-beta.24"
	criDockerd     = "-X github.com/Mirantis/cri-dockerd/cmd/version.Version=0.3.15 -X github.com/Mirantis/cri-dockerd/cmd/version.GitCommit=c1c566e"
)

func kubeletLd(v string) string { return "-X k8s.io/component-base/version.gitVersion=" + v }

// bin is a fake binary in a tree: its path and the ldflags it was built with.
type bin struct{ rel, ldflags string }

// containerdTree is a tree with a containerd runtime for Kubernetes v1.37.2.
var containerdTree = []bin{{"usr/bin/kubelet", kubelet1372}, {"usr/bin/containerd", containerd242}, {"usr/sbin/runc", runc153}}

// dockerTree is a tree with a docker runtime for Kubernetes v1.37.2 (containerd last).
var dockerTree = []bin{{"usr/bin/kubelet", kubelet1372}, {"usr/bin/dockerd", dockerd29}, {"usr/bin/cri-dockerd", criDockerd}, {"usr/sbin/runc", runc153}, {"usr/bin/containerd", containerd242}}

// with is base and extra, in a new slice.
func with(base []bin, extra ...bin) []bin { return append(append([]bin(nil), base...), extra...) }

// checkVersionsCase is a tree's binaries, the Kubernetes spec, and what checkVersions says of them.
type checkVersionsCase struct {
	name    string
	k       spec.Kubernetes
	bins    []bin
	symlink [2]string // optional: link name -> target, inside the tree
	want    []string  // substrings of the error; none = accepted
}

var checkVersionsCases = []checkVersionsCase{
	{"matching containerd tree", spec.Kubernetes{Version: "v1.37.2", Runtime: "containerd"}, with(containerdTree, bin{"usr/bin/kubectl", kubectl1372}), [2]string{}, nil},
	{"containerd built from source", spec.Kubernetes{Version: "v1.37.2", Runtime: "containerd"},
		[]bin{{"usr/bin/kubelet", kubelet1372}, {"usr/bin/containerd", containerdSrc}, {"usr/sbin/runc", runc153}}, [2]string{}, nil},
	{"kubelet in /usr/local/bin via an absolute symlink", spec.Kubernetes{Version: "v1.37.2", Runtime: "containerd"},
		[]bin{{"opt/k8s/kubelet", kubelet1372}, {"usr/bin/containerd", containerd242}, {"usr/sbin/runc", runc153}}, [2]string{"usr/local/bin/kubelet", "/opt/k8s/kubelet"}, nil},
	{"kubelet of another release", spec.Kubernetes{Version: "v1.37.3", Runtime: "containerd"}, containerdTree, [2]string{},
		[]string{`/usr/bin/kubelet reports v1.37.2 (-X k8s.io/component-base/version.gitVersion=v1.37.2) but kubernetes.version is v1.37.3`}},
	{"no kubelet", spec.Kubernetes{Version: "v1.37.2", Runtime: "containerd"}, containerdTree[1:], [2]string{},
		[]string{"kubelet is missing"}},
	{"containerd too old for 1.37", spec.Kubernetes{Version: "v1.37.2", Runtime: "containerd"},
		[]bin{{"usr/bin/kubelet", kubelet1372}, {"usr/bin/containerd", containerd2112}, {"usr/sbin/runc", runc153}}, [2]string{},
		[]string{"/usr/bin/containerd is v2.1.12; Kubernetes v1.37.2 needs containerd v2.2.0 or newer"}},
	{"containerd 1.7.28 for 1.37", spec.Kubernetes{Version: "v1.37.2", Runtime: "containerd"},
		[]bin{{"usr/bin/kubelet", kubelet1372}, {"usr/bin/containerd", containerd1728}, {"usr/sbin/runc", runc153}}, [2]string{},
		[]string{"is v1.7.28; Kubernetes v1.37.2 needs containerd v2.2.0 or newer"}},
	{"containerd 1.7.28 for 1.35", spec.Kubernetes{Version: "v1.35.4", Runtime: "containerd"},
		[]bin{{"usr/bin/kubelet", kubeletLd("v1.35.4")}, {"usr/bin/containerd", containerd1728}, {"usr/sbin/runc", runc153}}, [2]string{}, nil},
	{"containerd 1.7.27 for 1.35", spec.Kubernetes{Version: "v1.35.4", Runtime: "containerd"},
		[]bin{{"usr/bin/kubelet", kubeletLd("v1.35.4")}, {"usr/bin/containerd", "-X github.com/containerd/containerd/version.Version=1.7.27"}, {"usr/sbin/runc", runc153}}, [2]string{},
		[]string{"is v1.7.27; Kubernetes v1.35.4 needs containerd v1.7.28 or newer"}},
	{"containerd 2.2.0 for 1.36", spec.Kubernetes{Version: "v1.36.0", Runtime: "containerd"},
		[]bin{{"usr/bin/kubelet", kubeletLd("v1.36.0")}, {"usr/bin/containerd", "-X github.com/containerd/containerd/v2/version.Version=v2.2.0"}, {"usr/sbin/runc", runc153}}, [2]string{}, nil},
	{"no containerd", spec.Kubernetes{Version: "v1.37.2", Runtime: "containerd"}, []bin{{"usr/bin/kubelet", kubelet1372}, {"usr/sbin/runc", runc153}}, [2]string{},
		[]string{"containerd is missing"}},
	{"no runc", spec.Kubernetes{Version: "v1.37.2", Runtime: "containerd"}, containerdTree[:2], [2]string{},
		[]string{"runc is missing"}},
	{"kubectl two minors behind", spec.Kubernetes{Version: "v1.37.2", Runtime: "containerd"}, with(containerdTree, bin{"usr/bin/kubectl", kubeletLd("v1.35.0")}), [2]string{},
		[]string{"/usr/bin/kubectl is v1.35.0, more than one minor release away from kubernetes.version v1.37.2"}},
	{"kubectl one minor ahead", spec.Kubernetes{Version: "v1.37.2", Runtime: "containerd"}, with(containerdTree, bin{"usr/bin/kubectl", kubeletLd("v1.38.0")}), [2]string{}, nil},
	{"docker", spec.Kubernetes{Version: "v1.37.2", Runtime: "docker"}, dockerTree, [2]string{}, nil},
	{"docker built from moby's v2 module", spec.Kubernetes{Version: "v1.37.2", Runtime: "docker"},
		[]bin{{"usr/bin/kubelet", kubelet1372}, {"usr/bin/dockerd", dockerdModule}, {"usr/bin/cri-dockerd", criDockerd}, {"usr/bin/containerd", containerd242}, {"usr/sbin/runc", runc153}}, [2]string{}, nil},
	{"Docker Engine 26", spec.Kubernetes{Version: "v1.37.2", Runtime: "docker"},
		[]bin{{"usr/bin/kubelet", kubelet1372}, {"usr/bin/dockerd", dockerd}, {"usr/bin/cri-dockerd", criDockerd}, {"usr/bin/containerd", containerd242}, {"usr/sbin/runc", runc153}}, [2]string{},
		[]string{"/usr/bin/dockerd is Docker Engine v26.1.5; kubernetes.runtime docker needs Engine 29 or newer"}},
	{"dockerd without a version", spec.Kubernetes{Version: "v1.37.2", Runtime: "docker"},
		[]bin{{"usr/bin/kubelet", kubelet1372}, {"usr/bin/dockerd", "-s -w"}, {"usr/bin/cri-dockerd", criDockerd}, {"usr/bin/containerd", containerd242}, {"usr/sbin/runc", runc153}}, [2]string{},
		[]string{"/usr/bin/dockerd: cannot read Docker Engine's version"}},
	{"cri-dockerd before CRI v1", spec.Kubernetes{Version: "v1.37.2", Runtime: "docker"},
		[]bin{{"usr/bin/kubelet", kubelet1372}, {"usr/bin/dockerd", dockerd29}, {"usr/bin/cri-dockerd", "-X github.com/Mirantis/cri-dockerd/cmd/version.Version=0.2.6"}, {"usr/bin/containerd", containerd242}, {"usr/sbin/runc", runc153}}, [2]string{},
		[]string{`/usr/bin/cri-dockerd is cri-dockerd "v0.2.6"; Kubernetes 1.26 and newer speak CRI v1 only, which cri-dockerd serves since v0.3.0`}},
	{"docker without containerd", spec.Kubernetes{Version: "v1.37.2", Runtime: "docker"}, dockerTree[:4], [2]string{},
		[]string{"containerd is missing: kubernetes.runtime docker runs Docker Engine on the node's containerd"}},
	{"docker without cri-dockerd", spec.Kubernetes{Version: "v1.37.2", Runtime: "docker"},
		[]bin{{"usr/bin/kubelet", kubelet1372}, {"usr/bin/dockerd", dockerd29}, {"usr/bin/containerd", containerd242}, {"usr/sbin/runc", runc153}}, [2]string{},
		[]string{"cri-dockerd is missing: kubernetes.runtime docker needs it (kubelet has no dockershim since 1.24)"}},
	{"docker without dockerd", spec.Kubernetes{Version: "v1.37.2", Runtime: "docker"}, containerdTree, [2]string{},
		[]string{"dockerd is missing", "cri-dockerd is missing"}},
}

func TestCheckVersions(t *testing.T) {
	for _, tt := range checkVersionsCases {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			for _, b := range tt.bins {
				fakeBin(t, root, b.rel, b.ldflags)
			}
			if tt.symlink[0] != "" {
				os.MkdirAll(filepath.Join(root, filepath.Dir(tt.symlink[0])), 0o755)
				if err := os.Symlink(tt.symlink[1], filepath.Join(root, tt.symlink[0])); err != nil {
					t.Fatal(err)
				}
			}
			v, err := readVersions(context.Background(), root)
			if err != nil {
				t.Fatal(err)
			}
			err = checkVersions(tt.k, v)
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

// readVersions reads each version from the binary's Go build information; nothing runs (the
// test programs print v0.0.1 when run).
func TestReadVersions(t *testing.T) {
	script := []byte("#!/bin/sh\necho 'Kubernetes v1.37.2'\n")
	tests := []struct {
		name    string
		rel     string
		bin     func(t *testing.T) []byte
		mode    os.FileMode
		get     func(v treeVersions) *binaryVersion
		version string // with source: what readVersions reads
		source  string
		wantErr string // or the error it gives
	}{
		{"kubelet of a Kubernetes release build", "usr/bin/kubelet", func(t *testing.T) []byte { return goBinary(t, kubelet1372) }, 0o755,
			func(v treeVersions) *binaryVersion { return v.Kubelet }, "v1.37.2", "-X k8s.io/component-base/version.gitVersion=v1.37.2", ""},
		{"kubelet of an older release, vendored", "usr/local/bin/kubelet", func(t *testing.T) []byte {
			return goBinary(t, "-X k8s.io/kubernetes/vendor/k8s.io/client-go/pkg/version.gitVersion=v1.33.1 -X k8s.io/kubernetes/vendor/k8s.io/component-base/version.gitVersion=v1.33.1")
		}, 0o755, func(v treeVersions) *binaryVersion { return v.Kubelet }, "v1.33.1", "-X k8s.io/kubernetes/vendor/k8s.io/component-base/version.gitVersion=v1.33.1", ""},
		{"kubelet built with -trimpath from the release tag", "usr/bin/kubelet", func(t *testing.T) []byte { return goModuleBinary(t, "k8s.io/kubernetes", "v1.37.2") }, 0o755,
			func(v treeVersions) *binaryVersion { return v.Kubelet }, "v1.37.2", "module k8s.io/kubernetes v1.37.2", ""},
		{"kubectl", "usr/bin/kubectl", func(t *testing.T) []byte { return goBinary(t, kubectl1372) }, 0o755,
			func(v treeVersions) *binaryVersion { return v.Kubectl }, "v1.37.2", "-X k8s.io/component-base/version.gitVersion=v1.37.2", ""},
		{"containerd 2 built from source", "usr/bin/containerd", func(t *testing.T) []byte { return goBinary(t, containerdSrc) }, 0o755,
			func(v treeVersions) *binaryVersion { return v.Containerd }, "v2.4.2", "-X github.com/containerd/containerd/v2/version.Version=2.4.2+unknown", ""},
		{"containerd 1.7", "usr/bin/containerd", func(t *testing.T) []byte { return goBinary(t, containerd1728) }, 0o755,
			func(v treeVersions) *binaryVersion { return v.Containerd }, "v1.7.28", "-X github.com/containerd/containerd/version.Version=1.7.28", ""},
		{"runc", "usr/sbin/runc", func(t *testing.T) []byte { return goBinary(t, runc153) }, 0o755,
			func(v treeVersions) *binaryVersion { return v.Runc }, "v1.5.3", "-X main.version=1.5.3", ""},
		{"dockerd", "usr/bin/dockerd", func(t *testing.T) []byte { return goBinary(t, dockerd) }, 0o755,
			func(v treeVersions) *binaryVersion { return v.Dockerd }, "v26.1.5", "-X github.com/docker/docker/dockerversion.Version=26.1.5+dfsg1", ""},
		{"cri-dockerd", "usr/bin/cri-dockerd", func(t *testing.T) []byte { return goBinary(t, criDockerd) }, 0o755,
			func(v treeVersions) *binaryVersion { return v.CRIDockerd }, "v0.3.15", "-X github.com/Mirantis/cri-dockerd/cmd/version.Version=0.3.15", ""},
		{"runc that is no Go program: present, version unknown", "usr/sbin/runc", func(*testing.T) []byte { return script }, 0o755,
			func(v treeVersions) *binaryVersion { return v.Runc }, "", "", ""},
		{"kubelet that is no Go program", "usr/bin/kubelet", func(*testing.T) []byte { return script }, 0o755, nil, "", "",
			"/usr/bin/kubelet: cannot read its version: it has no Go build information"},
		{"kubelet built with -trimpath, not from a tag", "usr/bin/kubelet", func(t *testing.T) []byte { return goBinary(t, kubeletLd("v1.37.2"), "-trimpath") }, 0o755, nil, "", "",
			`/usr/bin/kubelet: its Go build information records no release version (main module kiln.test/prog (devel), no -ldflags recorded), and kiln does not run binaries from the image to ask them: build it from a release tag of k8s.io/kubernetes, or with -ldflags "-X k8s.io/component-base/version.gitVersion=<version>" and without -trimpath`},
		{"containerd without a version", "usr/bin/containerd", func(t *testing.T) []byte { return goBinary(t, "-s -w") }, 0o755, nil, "", "",
			"/usr/bin/containerd: its Go build information records no release version (main module kiln.test/prog (devel), -ldflags without -X github.com/containerd/containerd/v2/version.Version)"},
		{"kubelet whose version variable is no version", "usr/bin/kubelet", func(t *testing.T) []byte {
			return goBinary(t, "-X k8s.io/component-base/version.gitVersion=$Format:%h$")
		}, 0o755, nil, "", "",
			`/usr/bin/kubelet: its build information sets -X k8s.io/component-base/version.gitVersion="$Format:%h$", which is not a version`},
		{"not executable", "usr/bin/kubelet", func(t *testing.T) []byte { return goBinary(t, kubelet1372) }, 0o644, nil, "", "",
			"/usr/bin/kubelet is not executable (mode -rw-r--r--)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			putFile(t, root, tt.rel, tt.bin(t))
			os.Chmod(filepath.Join(root, tt.rel), tt.mode)
			v, err := readVersions(context.Background(), root)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			b := tt.get(v)
			if b == nil || b.Path != "/"+tt.rel || b.Version != tt.version || b.Source != tt.source {
				t.Errorf("read %+v, want /%s %q from %q", b, tt.rel, tt.version, tt.source)
			}
		})
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
		err := checkKernelArgs(tt.k, tt.args)
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%s %q: refused: %v", tt.k.Version, tt.args, err)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("%s %q: error %v, want %q", tt.k.Version, tt.args, err, tt.want)
		}
	}
}

// kiln bake -o out gives a relative tree.
func TestReadVersionsRelativeRoot(t *testing.T) {
	dir := t.TempDir()
	fakeBin(t, filepath.Join(dir, "tree"), "usr/bin/kubelet", kubelet1372)
	t.Chdir(dir)
	v, err := readVersions(context.Background(), "tree")
	if err != nil {
		t.Fatal(err)
	}
	if v.Kubelet == nil || v.Kubelet.Version != "v1.37.2" {
		t.Fatalf("kubelet version %+v, want v1.37.2", v.Kubelet)
	}
}

// The binaries the end-to-end test bakes (qemu-tests/e2e/build-components.sh) are built with
// -trimpath, so their build information has no -ldflags: their versions come from their
// modules.
func TestReadVersionsE2EBinaries(t *testing.T) {
	home, _ := os.UserHomeDir()
	bin := filepath.Join(home, ".cache/kiln/e2e/bin")
	root := t.TempDir()
	for _, rel := range []string{"usr/bin/kubelet", "usr/bin/kubectl", "usr/bin/containerd", "usr/sbin/runc"} {
		b, err := os.ReadFile(filepath.Join(bin, filepath.Base(rel)))
		if err != nil {
			t.Skipf("no end-to-end binaries: %v", err)
		}
		putFile(t, root, rel, b)
	}
	v, err := readVersions(context.Background(), root)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		b    *binaryVersion
		want string
	}{{v.Kubelet, "module k8s.io/kubernetes v1.37.2"}, {v.Kubectl, "module k8s.io/kubernetes v1.37.2"},
		{v.Containerd, "module github.com/containerd/containerd/v2 v2.4.2"}, {v.Runc, "module github.com/opencontainers/runc v1.5.3"}} {
		if c.b == nil || c.b.Source != c.want {
			t.Errorf("read %+v, want a version from %q", c.b, c.want)
		}
	}
	if err := checkVersions(spec.Kubernetes{Version: "v1.37.2", Runtime: "containerd"}, v); err != nil {
		t.Error(err)
	}
	// With Docker built (build-components.sh docker), the docker runtime's rules take them.
	for _, rel := range []string{"usr/bin/dockerd", "usr/bin/cri-dockerd"} {
		b, err := os.ReadFile(filepath.Join(bin, filepath.Base(rel)))
		if err != nil {
			t.Logf("no Docker among the end-to-end binaries: %v", err)
			return
		}
		putFile(t, root, rel, b)
	}
	if v, err = readVersions(context.Background(), root); err != nil {
		t.Fatal(err)
	}
	if err := checkVersions(spec.Kubernetes{Version: "v1.37.2", Runtime: "docker"}, v); err != nil {
		t.Errorf("the e2e's Docker: %v", err)
	}
}
