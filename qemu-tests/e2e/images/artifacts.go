package main

import (
	"archive/tar"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/kilnproject/kiln/internal/atomicfile"
)

// localArtifact is one of the profile's artifacts rebuilt from the components the e2e
// built from source, in the same shape as the upstream release file it stands for
// (a plain binary or a tarball with the same member names), so the profile's extract
// rules apply unchanged and only url and sha256 differ.
type localArtifact struct {
	name  string            // the profile's artifact name
	file  string            // file name served
	plain string            // a plain binary: the component's file name
	tar   map[string]string // a tarball: member name → component file name
	// docker marks the artifacts only profiles/docker/worker.yaml has; they are packed when
	// build-components.sh built Docker (its docker group).
	docker bool
}

// e2eArtifacts are the profiles' binary artifacts (profiles/*.yaml), by name.
var e2eArtifacts = []localArtifact{
	{name: "kubelet", file: "kubelet", plain: "kubelet"},
	{name: "kubectl", file: "kubectl", plain: "kubectl"},
	{name: "runc", file: "runc.amd64", plain: "runc"},
	{name: "containerd", file: "containerd-linux-amd64.tar.gz", tar: map[string]string{
		"bin/containerd": "containerd", "bin/containerd-shim-runc-v2": "containerd-shim-runc-v2", "bin/ctr": "ctr"}},
	{name: "crictl", file: "crictl-linux-amd64.tar.gz", tar: map[string]string{"crictl": "crictl"}},
	{name: "etcd", file: "etcd-linux-amd64.tar.gz", tar: map[string]string{
		"etcd-v3.6.16-linux-amd64/etcd": "etcd", "etcd-v3.6.16-linux-amd64/etcdctl": "etcdctl"}},
	{name: "cni-plugins", file: "cni-plugins-linux-amd64.tgz", tar: map[string]string{
		"./bridge": "bridge", "./host-local": "host-local", "./loopback": "loopback", "./portmap": "portmap"}},
	{name: "docker", file: "docker-amd64.tgz", docker: true, tar: map[string]string{
		"docker/dockerd": "dockerd", "docker/docker-proxy": "docker-proxy", "docker/docker": "docker"}},
	{name: "cri-dockerd", file: "cri-dockerd-amd64.tgz", docker: true, tar: map[string]string{"cri-dockerd/cri-dockerd": "cri-dockerd"}},
}

// dockerProfile names what profiles/docker/worker.yaml pins: its artifacts and images. Its
// profile overlay names these only (an overlay naming anything no profile has is refused).
var dockerProfile = struct{ artifacts, images []string }{
	artifacts: []string{"kubelet", "containerd", "runc", "crictl", "cni-plugins", "docker", "cri-dockerd"},
	images:    []string{"registry.k8s.io/pause:3.10.2", "registry.k8s.io/kube-proxy:v1.37.2", "registry.k8s.io/coredns/coredns:v1.15.0"},
}

// built reports whether bin holds every component a's files come from.
func (a localArtifact) built(bin string) bool {
	files := []string{a.plain}
	if a.plain == "" {
		files = files[:0]
		for _, f := range a.tar {
			files = append(files, f)
		}
	}
	for _, f := range files {
		if _, err := os.Stat(filepath.Join(bin, f)); err != nil {
			return false
		}
	}
	return true
}

// packArtifacts writes every local artifact into dir (reproducibly: fixed times, sorted
// members) and returns each one's sha256 by name. Docker's are left out when Docker was not
// built.
func packArtifacts(bin, dir string) (map[string]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	sums := map[string]string{}
	for _, a := range e2eArtifacts {
		if a.docker && !a.built(bin) {
			continue
		}
		dst := filepath.Join(dir, a.file)
		var err error
		if a.plain != "" {
			err = atomicfile.Copy(filepath.Join(bin, a.plain), dst, atomicfile.Options{Mode: 0o755})
		} else {
			err = writeTarGz(dst, bin, a.tar)
		}
		if err != nil {
			return nil, fmt.Errorf("artifact %s: %w", a.name, err)
		}
		if sums[a.name], err = fileSHA256(dst); err != nil {
			return nil, err
		}
	}
	return sums, nil
}

// writeOverlay writes the profile overlay (kiln bake --profile-overlay) that points the
// profiles' artifacts at the packed files — by URL under baseURL, or by absolute path when
// baseURL is empty — and their images at the pushed copies: those of profiles/ (docker false)
// or those of profiles/docker (docker true).
func writeOverlay(file, dir, baseURL string, sums map[string]string, images map[string]Pushed, docker bool) error {
	var b strings.Builder
	b.WriteString("# Written by qemu-tests/e2e/images: the profiles' artifacts and images, built from source here.\nartifacts:\n")
	for _, a := range e2eArtifacts {
		if docker && !slices.Contains(dockerProfile.artifacts, a.name) || !docker && a.docker {
			continue
		}
		if _, ok := sums[a.name]; !ok {
			return fmt.Errorf("artifact %s was not packed (make e2e RUNTIME=docker builds Docker)", a.name)
		}
		if baseURL != "" {
			fmt.Fprintf(&b, "  - {name: %s, url: %q, sha256: %s}\n", a.name, strings.TrimSuffix(baseURL, "/")+"/"+a.file, sums[a.name])
		} else {
			abs, err := filepath.Abs(filepath.Join(dir, a.file))
			if err != nil {
				return err
			}
			fmt.Fprintf(&b, "  - {name: %s, path: %q, sha256: %s}\n", a.name, abs, sums[a.name])
		}
	}
	b.WriteString("images:\n")
	for _, name := range sortedKeys(images) {
		if docker && !slices.Contains(dockerProfile.images, name) {
			continue
		}
		fmt.Fprintf(&b, "  - {name: %q, source: %q, digest: %q}\n", name, images[name].Source, images[name].Digest)
	}
	return os.WriteFile(file, []byte(b.String()), 0o644)
}

func writeTarGz(dst, bin string, members map[string]string) error {
	f, err := os.Create(dst)
	if err != nil {
		return err
	}
	defer f.Close()
	zw := gzip.NewWriter(f)
	tw := tar.NewWriter(zw)
	names := make([]string, 0, len(members))
	for m := range members {
		names = append(names, m)
	}
	sort.Strings(names)
	dirs := map[string]bool{}
	for _, m := range names {
		if d := filepath.Dir(strings.TrimPrefix(m, "./")); d != "." && !dirs[d] {
			dirs[d] = true
			if err := tw.WriteHeader(hdr(d+"/", tar.TypeDir, 0o755)); err != nil {
				return err
			}
		}
		if err := copyFile(tw, filepath.Join(bin, members[m]), m, 0o755); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return zw.Close()
}

func fileSHA256(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
