package qemutests

import (
	"archive/tar"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"
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
}

// e2eArtifacts are the profiles' binary artifacts (profiles/*.yaml), by name.
var e2eArtifacts = []localArtifact{
	{name: "kubelet", file: "kubelet", plain: "kubelet"},
	{name: "kubectl", file: "kubectl", plain: "kubectl"},
	{name: "runc", file: "runc.amd64", plain: "runc"},
	{name: "containerd", file: "containerd-linux-amd64.tar.gz", tar: map[string]string{
		"bin/containerd": "containerd", "bin/containerd-shim-runc-v2": "containerd-shim-runc-v2", "bin/ctr": "ctr"}},
	{name: "crictl", file: "crictl-linux-amd64.tar.gz", tar: map[string]string{"crictl": "crictl"}},
	{name: "cni-plugins", file: "cni-plugins-linux-amd64.tgz", tar: map[string]string{
		"./bridge": "bridge", "./host-local": "host-local", "./loopback": "loopback", "./portmap": "portmap"}},
}

// packArtifacts writes every local artifact into dir (reproducibly: fixed times, sorted
// members) and returns each one's sha256 by name.
func packArtifacts(t *testing.T, bin, dir string) map[string]string {
	t.Helper()
	sums := map[string]string{}
	for _, a := range e2eArtifacts {
		dst := filepath.Join(dir, a.file)
		var err error
		if a.plain != "" {
			err = copyFile(filepath.Join(bin, a.plain), dst)
		} else {
			err = writeTarGz(dst, bin, a.tar)
		}
		if err != nil {
			t.Fatalf("artifact %s: %v", a.name, err)
		}
		sum, err := fileSHA256(dst)
		if err != nil {
			t.Fatal(err)
		}
		sums[a.name] = sum
	}
	return sums
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
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
	epoch := time.Unix(0, 0)
	dirs := map[string]bool{}
	for _, m := range names {
		if d := filepath.Dir(strings.TrimPrefix(m, "./")); d != "." && !dirs[d] {
			dirs[d] = true
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755, ModTime: epoch}); err != nil {
				return err
			}
		}
		src := filepath.Join(bin, members[m])
		st, err := os.Stat(src)
		if err != nil {
			return err
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: m, Mode: 0o755, Size: st.Size(), ModTime: epoch}); err != nil {
			return err
		}
		in, err := os.Open(src)
		if err != nil {
			return err
		}
		_, err = io.Copy(tw, in)
		in.Close()
		if err != nil {
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

// serveDir serves dir over HTTP on 127.0.0.1 for the test's lifetime and returns its URL.
func serveDir(t *testing.T, dir string) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.FileServer(http.Dir(dir))}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return fmt.Sprintf("http://%s", l.Addr())
}
