package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kilnproject/kiln/builder/spec"
)

// The packed artifacts have the members the real profiles extract, and the overlay names
// only artifacts and images the repository's profiles have: kiln accepts it and re-points
// every Kubernetes artifact of the roles.
func TestOverlayMatchesTheProfiles(t *testing.T) {
	bin := t.TempDir()
	for _, a := range e2eArtifacts {
		names := []string{a.plain}
		if a.plain == "" {
			names = nil
			for _, c := range a.tar {
				names = append(names, c)
			}
		}
		for _, n := range names {
			if err := os.WriteFile(filepath.Join(bin, n), []byte("#!/bin/sh\necho "+n+"\n"), 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	dir := filepath.Join(t.TempDir(), "artifacts")
	sums, err := packArtifacts(bin, dir)
	if err != nil {
		t.Fatal(err)
	}
	for file, member := range map[string]string{"containerd-linux-amd64.tar.gz": "bin/containerd-shim-runc-v2",
		"docker-amd64.tgz": "docker/dockerd", "cri-dockerd-amd64.tgz": "cri-dockerd/cri-dockerd",
		"etcd-linux-amd64.tar.gz": "etcd-v3.6.16-linux-amd64/etcdctl"} {
		out, err := exec.Command("tar", "-tzf", filepath.Join(dir, file)).CombinedOutput()
		if err != nil || !strings.Contains(string(out), member) {
			t.Errorf("%s members: %s %v", file, out, err)
		}
	}
	images := map[string]Pushed{
		"registry.k8s.io/pause:3.10.2":            {Source: "127.0.0.1:5000/pause:3.10.2", Digest: "sha256:" + strings.Repeat("a", 64)},
		"registry.k8s.io/kube-proxy:v1.37.2":      {Source: "127.0.0.1:5000/kube-proxy:v1.37.2", Digest: "sha256:" + strings.Repeat("b", 64)},
		"registry.k8s.io/coredns/coredns:v1.15.0": {Source: "127.0.0.1:5000/coredns/coredns:v1.15.0", Digest: "sha256:" + strings.Repeat("c", 64)},
	}
	for _, tc := range []struct {
		def    string // the definition whose profiles the overlay is for
		docker bool
	}{
		{"qemu.yaml", false},
		{"qemu-docker.yaml", true},
	} {
		t.Run(tc.def, func(t *testing.T) {
			overlay := filepath.Join(t.TempDir(), "local.yaml")
			if err := writeOverlay(overlay, dir, "", sums, images, tc.docker); err != nil {
				t.Fatal(err)
			}
			ov, err := spec.LoadProfileOverlay(overlay)
			if err != nil {
				t.Fatal(err)
			}
			def, err := spec.LoadDefinition(filepath.Join("..", "..", "..", "images", tc.def))
			if err != nil {
				t.Fatal(err)
			}
			profiles, err := def.Profiles()
			if err != nil {
				t.Fatal(err)
			}
			if err := ov.Check(profiles); err != nil {
				t.Fatalf("the overlay does not match the profiles: %v", err)
			}
			for _, p := range profiles {
				if p.Role != "worker" {
					continue
				}
				got := ov.Apply(p)
				for _, a := range got.Artifacts {
					if a.Path == "" || !strings.HasPrefix(a.Path, dir) {
						t.Errorf("worker artifact %s still from %q %q", a.Name, a.URL, a.Path)
					}
				}
				for _, im := range got.Images {
					if !strings.HasPrefix(im.Source, "127.0.0.1:5000/") {
						t.Errorf("worker image %s still from %q", im.Name, im.Source)
					}
				}
			}
		})
	}
}
