package artifact

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/kilnproject/kiln/builder/spec"
	"github.com/kilnproject/kiln/internal/testkit"
)

// testkit.Entry is one tar member.
// compress returns data in format: "tar" as is, "tar.gz", "tar.xz" or "tar.zst" compressed.
func compress(t *testing.T, format string, data []byte) []byte {
	t.Helper()
	if format == "tar" {
		return data
	}
	return testkit.Compress(t, strings.TrimPrefix(format, "tar."), data)
}

func deb(t *testing.T, data []byte, comp string) []byte {
	t.Helper()
	var buf bytes.Buffer
	buf.WriteString("!<arch>\n")
	member := func(name string, body []byte) {
		fmt.Fprintf(&buf, "%-16s%-12d%-6d%-6d%-8s%-10d`\n", name, 0, 0, 0, "100644", len(body))
		buf.Write(body)
		if len(body)%2 == 1 {
			buf.WriteByte('\n')
		}
	}
	member("debian-binary", []byte("2.0\n"))
	member("control.tar.gz", compress(t, "tar.gz", testkit.Tar(t, testkit.Entry{Name: "./control", Type: tar.TypeReg, Mode: 0o644, Body: "Package: x\n"})))
	member("data.tar."+strings.TrimPrefix(comp, "tar."), compress(t, comp, data))
	return buf.Bytes()
}

// bzip2Bytes compresses with the bzip2 command (the standard library only reads it).
func bzip2Bytes(t *testing.T, data []byte) []byte {
	cmd := exec.Command("bzip2", "-c")
	cmd.Stdin = bytes.NewReader(data)
	out, err := cmd.Output()
	if err != nil {
		t.Skipf("bzip2: %v", err)
	}
	return out
}

var cniEntries = []testkit.Entry{
	{Name: "./", Type: tar.TypeDir, Mode: 0o755},
	{Name: "./bin/", Type: tar.TypeDir, Mode: 0o755},
	{Name: "./bin/bridge", Type: tar.TypeReg, Mode: 0o755, Body: "bridge binary"},
	{Name: "./bin/host-local", Type: tar.TypeReg, Mode: 0o4750, Body: "host-local binary"},
	{Name: "./bin/README", Type: tar.TypeReg, Mode: 0o644, Body: "readme"},
	{Name: "./bin/loopback", Type: tar.TypeSymlink, Link: "bridge"},
	{Name: "./bin/portmap", Type: tar.TypeLink, Link: "./bin/bridge"},
}

func writeBlob(t *testing.T, b []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "blob")
	if err := os.WriteFile(p, b, 0o444); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestExtractFormats(t *testing.T) {
	data := testkit.Tar(t, cniEntries...)
	blobs := map[string][]byte{
		"tar":     data,
		"tar.gz":  compress(t, "tar.gz", data),
		"tar.xz":  compress(t, "tar.xz", data),
		"tar.zst": compress(t, "tar.zst", data),
		"deb":     deb(t, data, "tar.xz"),
		"tar.bz2": bzip2Bytes(t, data),
	}
	for format, blob := range blobs {
		t.Run(format, func(t *testing.T) {
			root := t.TempDir()
			paths, err := Extract(writeBlob(t, blob), spec.Extract{Format: format, Dir: "/opt/cni", Strip: 1}, root, MaxUnpacked)
			if err != nil {
				t.Fatal(err)
			}
			want := []string{"/opt/cni/bridge", "/opt/cni/host-local", "/opt/cni/README", "/opt/cni/loopback", "/opt/cni/portmap"}
			if !reflect.DeepEqual(paths, want) {
				t.Errorf("paths %v, want %v", paths, want)
			}
			for _, f := range []struct {
				name string
				mode fs.FileMode
				body string
			}{
				{"bridge", 0o755, "bridge binary"},
				{"host-local", 0o750 | fs.ModeSetuid, "host-local binary"},
				{"README", 0o644, "readme"},
				{"portmap", 0o755, "bridge binary"},
			} {
				p := filepath.Join(root, "opt/cni", f.name)
				fi, err := os.Lstat(p)
				if err != nil {
					t.Fatal(err)
				}
				if fi.Mode() != f.mode {
					t.Errorf("%s: mode %v, want %v", f.name, fi.Mode(), f.mode)
				}
				if b, _ := os.ReadFile(p); string(b) != f.body {
					t.Errorf("%s: content %q", f.name, b)
				}
			}
			if l, err := os.Readlink(filepath.Join(root, "opt/cni/loopback")); err != nil || l != "bridge" {
				t.Errorf("loopback symlink: %q %v", l, err)
			}
		})
	}
}

func TestExtractFiles(t *testing.T) {
	data := compress(t, "tar.gz", testkit.Tar(t, []testkit.Entry{
		{Name: "crictl", Type: tar.TypeReg, Mode: 0o755, Body: "crictl binary"},
		{Name: "LICENSE", Type: tar.TypeReg, Mode: 0o644, Body: "license"},
	}...))
	root := t.TempDir()
	// An older file at the destination is replaced.
	os.MkdirAll(filepath.Join(root, "usr/local/bin"), 0o755)
	os.WriteFile(filepath.Join(root, "usr/local/bin/crictl"), []byte("old"), 0o600)

	paths, err := Extract(writeBlob(t, data), spec.Extract{Format: "tar.gz", Files: map[string]string{"crictl": "/usr/local/bin/crictl"}}, root, MaxUnpacked)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(paths, []string{"/usr/local/bin/crictl"}) {
		t.Errorf("paths %v", paths)
	}
	fi, err := os.Stat(filepath.Join(root, "usr/local/bin/crictl"))
	if err != nil || fi.Mode() != 0o755 || fi.Size() != int64(len("crictl binary")) {
		t.Errorf("crictl: %v %v", fi, err)
	}
	if _, err := os.Stat(filepath.Join(root, "LICENSE")); err == nil {
		t.Error("extracted a member that was not asked for")
	}

	_, err = Extract(writeBlob(t, data), spec.Extract{Format: "tar.gz", Files: map[string]string{"bin/crictl": "/usr/bin/crictl", "crictl": "/c"}}, t.TempDir(), MaxUnpacked)
	if want := "archive has no file bin/crictl (it has: crictl, LICENSE)"; err == nil || err.Error() != want {
		t.Errorf("missing member: got %v, want %s", err, want)
	}
}

func TestExtractRefusesEscapes(t *testing.T) {
	tests := []struct {
		name    string
		entries []testkit.Entry
		wantErr string
	}{
		{"dotdot", []testkit.Entry{{Name: "ok", Type: tar.TypeReg, Mode: 0o644, Body: "x"}, {Name: "../../escaped", Type: tar.TypeReg, Mode: 0o644, Body: "x"}},
			`member "../../escaped" escapes the destination`},
		{"through symlink", []testkit.Entry{{Name: "link", Type: tar.TypeSymlink, Link: "../../.."}, {Name: "link/escaped", Type: tar.TypeReg, Mode: 0o644, Body: "x"}},
			"member link/escaped: "},
		{"through absolute symlink", []testkit.Entry{{Name: "etc", Type: tar.TypeSymlink, Link: "/etc"}, {Name: "etc/escaped", Type: tar.TypeReg, Mode: 0o644, Body: "x"}},
			"member etc/escaped: "},
		{"symlink out of the destination", []testkit.Entry{{Name: "link", Type: tar.TypeSymlink, Link: "../../etc"}, {Name: "link/escaped", Type: tar.TypeReg, Mode: 0o644, Body: "x"}},
			"member link/escaped: "},
		{"hard link out", []testkit.Entry{{Name: "passwd", Type: tar.TypeLink, Link: "../../../etc/passwd"}},
			`member "passwd": hard link to "../../../etc/passwd" escapes the destination`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			outside := t.TempDir()
			root := filepath.Join(outside, "a", "root")
			os.MkdirAll(root, 0o755)
			_, err := Extract(writeBlob(t, testkit.Tar(t, tt.entries...)), spec.Extract{Format: "tar", Dir: "/opt/x"}, root, MaxUnpacked)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("error %v, want %q", err, tt.wantErr)
			}
			filepath.WalkDir(outside, func(p string, d fs.DirEntry, err error) error {
				if d != nil && d.Name() == "escaped" {
					t.Errorf("wrote %s", p)
				}
				return nil
			})
			if _, err := os.Stat("/escaped"); err == nil {
				t.Error("wrote /escaped")
			}
		})
	}
}

func TestPlace(t *testing.T) {
	root := t.TempDir()
	blob := writeBlob(t, []byte("[plugins]\n"))
	paths, err := place(blob, spec.Artifact{Name: "config", Dest: "/etc/containerd/config.toml", Mode: 0o600}, root, MaxUnpacked)
	if err != nil || !reflect.DeepEqual(paths, []string{"/etc/containerd/config.toml"}) {
		t.Fatalf("Place = %v, %v", paths, err)
	}
	fi, err := os.Stat(filepath.Join(root, "etc/containerd/config.toml"))
	if err != nil || fi.Mode() != 0o600 {
		t.Errorf("placed file: %v %v", fi, err)
	}
	_, err = place(blob, spec.Artifact{Name: "bad", Extract: &spec.Extract{Format: "tar.gz", Dir: "/opt"}}, root, MaxUnpacked)
	if err == nil || !strings.HasPrefix(err.Error(), `artifact "bad": extract tar.gz: gzip: invalid header`) {
		t.Errorf("extracting a non-archive: %v", err)
	}
}

// TestExtractRealDeb builds a package with dpkg-deb and takes a file out of it.
func TestExtractRealDeb(t *testing.T) {
	if _, err := exec.LookPath("dpkg-deb"); err != nil {
		t.Skip("no dpkg-deb")
	}
	for _, comp := range []string{"xz", "gzip", "zstd"} {
		t.Run(comp, func(t *testing.T) {
			pkg := filepath.Join(t.TempDir(), "pkg")
			os.MkdirAll(filepath.Join(pkg, "DEBIAN"), 0o755)
			os.MkdirAll(filepath.Join(pkg, "usr/bin"), 0o755)
			os.WriteFile(filepath.Join(pkg, "DEBIAN/control"), []byte("Package: kiln-test\nVersion: 1.0\nArchitecture: amd64\nMaintainer: kiln <kiln@example.com>\nDescription: test\n"), 0o644)
			os.WriteFile(filepath.Join(pkg, "usr/bin/kiln-test"), []byte("#!/bin/sh\n"), 0o755)
			debFile := filepath.Join(t.TempDir(), "kiln-test.deb")
			if out, err := exec.Command("dpkg-deb", "--root-owner-group", "-Z"+comp, "--build", pkg, debFile).CombinedOutput(); err != nil {
				t.Skipf("dpkg-deb -Z%s: %v\n%s", comp, err, out)
			}
			root := t.TempDir()
			paths, err := Extract(debFile, spec.Extract{Format: "deb", Files: map[string]string{"usr/bin/kiln-test": "/usr/local/bin/kiln-test"}}, root, MaxUnpacked)
			if err != nil {
				t.Fatal(err)
			}
			fi, err := os.Stat(filepath.Join(root, "usr/local/bin/kiln-test"))
			if err != nil || fi.Mode() != 0o755 || !reflect.DeepEqual(paths, []string{"/usr/local/bin/kiln-test"}) {
				t.Errorf("extracted %v: %v %v", paths, fi, err)
			}
		})
	}
}
