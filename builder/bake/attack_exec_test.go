package bake

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// hostileScript is a program a base image or an artifact could put where the bake looks for
// kubelet: run on the build host, it leaves sentinel behind and reports the expected version.
func hostileScript(sentinel string) []byte {
	return []byte("#!/bin/sh\ntouch '" + sentinel + "'\necho 'Kubernetes v1.37.2'\necho 'containerd github.com/containerd/containerd/v2 v2.4.2'\necho 'runc version 1.5.3'\n")
}

// Reading the versions of the binaries in a tree runs none of them on the build host: a
// binary whose version cannot be read without running it is reported by its path.
func TestReadVersionsRunsNothingFromTheTree(t *testing.T) {
	tests := []struct {
		name    string
		hostile []string  // where the script is put, or what links to /opt/evil
		link    [2]string // optional: link name -> target, inside the tree
		want    string    // substring of readVersions' error; "" = read without error
	}{
		{"kubelet", []string{"usr/bin/kubelet"}, [2]string{}, "/usr/bin/kubelet: cannot read its version: it has no Go build information"},
		{"containerd in /usr/local/sbin", []string{"usr/local/sbin/containerd"}, [2]string{}, "/usr/local/sbin/containerd: cannot read its version"},
		{"kubectl through a symlink", []string{"opt/evil"}, [2]string{"usr/local/bin/kubectl", "/opt/evil"}, "/usr/local/bin/kubectl: cannot read its version"},
		{"runc, only checked for presence", []string{"usr/sbin/runc"}, [2]string{}, ""},
		{"every binary", []string{"usr/local/sbin/kubelet", "usr/local/sbin/kubectl", "usr/local/sbin/containerd", "usr/local/sbin/runc", "usr/local/sbin/dockerd", "usr/local/sbin/cri-dockerd"}, [2]string{},
			"/usr/local/sbin/kubelet: cannot read its version"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			sentinel := filepath.Join(t.TempDir(), "ran")
			fakeBin(t, root, "usr/bin/kubelet", kubelet1372)
			fakeBin(t, root, "usr/bin/containerd", containerd242)
			fakeBin(t, root, "usr/sbin/runc", runc153)
			for _, rel := range tt.hostile {
				putFile(t, root, rel, hostileScript(sentinel))
			}
			if tt.link[0] != "" {
				os.MkdirAll(filepath.Join(root, filepath.Dir(tt.link[0])), 0o755)
				if err := os.Symlink(tt.link[1], filepath.Join(root, tt.link[0])); err != nil {
					t.Fatal(err)
				}
			}
			_, err := readVersions(context.Background(), root)
			if _, serr := os.Stat(sentinel); serr == nil {
				t.Errorf("a binary from the tree ran on the build host (%s exists)", sentinel)
			}
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("error %v, want %q", err, tt.want)
			}
		})
	}
}

// The same through a whole bake: an overlay's /usr/local/bin/kubelet (looked up before the
// artifact's /usr/bin/kubelet) does not run, and the bake names it.
func TestBakeRunsNoKubeletFromTheTree(t *testing.T) {
	r := newK8sRepo(t, "")
	r.lock(t)
	sentinel := filepath.Join(t.TempDir(), "ran")
	p := filepath.Join(r.dir, "overlays/kubernetes/usr/local/bin/kubelet")
	putFile(t, filepath.Dir(p), "kubelet", hostileScript(sentinel))
	_, err := r.bakeWith(t)
	if _, serr := os.Stat(sentinel); serr == nil {
		t.Errorf("the bake ran the image's kubelet on the build host (%s exists)", sentinel)
	}
	if err == nil || !strings.Contains(err.Error(), "worker.yaml:7: kubernetes v1.37.2 (runtime containerd): /usr/local/bin/kubelet: cannot read its version") {
		t.Fatalf("error %v, want the bake to name /usr/local/bin/kubelet", err)
	}
	r.assertNoOutput(t)
}
