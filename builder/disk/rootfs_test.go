package disk

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kilnproject/kiln/internal/testkit"
)

// smallTree lays out a little root tree and returns its path.
func smallTree(t *testing.T) string {
	t.Helper()
	root := filepath.Join(t.TempDir(), "tree")
	files := map[string]string{
		"etc/os-release":        "PRETTY_NAME=\"kiln test\"\nID=kiln\n",
		"etc/hostname":          "kiln\n",
		"usr/bin/hello":         "#!/bin/sh\necho hello\n",
		"usr/lib/kiln/data.txt": strings.Repeat("kiln root filesystem test data\n", 2000),
		"var/lib/kiln/.keep":    "",
		"home/user/secret":      "not for everyone\n",
	}
	for name, content := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(filepath.Join(root, "usr/bin/hello"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, l := range [][2]string{{"usr/bin", "bin"}, {"usr/lib", "lib"}} {
		if err := os.Symlink(l[0], filepath.Join(root, l[1])); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	return testkit.Run(t, testkit.Tool(t, name, ""), args...)
}

func TestMakeRootFS(t *testing.T) {
	tree := smallTree(t)
	tests := []struct {
		name string
		opts RootFSOptions
	}{
		{"squashfs default", RootFSOptions{}},
		{"squashfs zstd 15", RootFSOptions{Type: SquashFS, Compression: "zstd", Level: 15}},
		{"squashfs lz4", RootFSOptions{Type: SquashFS, Compression: "lz4"}},
		{"squashfs gzip", RootFSOptions{Type: SquashFS, Compression: "gzip", Level: 9, SourceDateEpoch: 1700000000}},
		{"erofs default", RootFSOptions{Type: EROFS}},
		{"erofs lz4hc 12", RootFSOptions{Type: EROFS, Compression: "lz4hc", Level: 12}},
		{"erofs uncompressed", RootFSOptions{Type: EROFS, Compression: "none"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			a, b := filepath.Join(dir, "a.img"), filepath.Join(dir, "b.img")
			for _, out := range []string{a, b} {
				if err := MakeRootFS(context.Background(), tree, out, tc.opts); err != nil {
					t.Fatal(err)
				}
			}
			da, _ := os.ReadFile(a)
			db, _ := os.ReadFile(b)
			if !bytes.Equal(da, db) {
				t.Errorf("two builds of the same tree differ (%d and %d bytes)", len(da), len(db))
			}
			got := readBack(t, tc.opts.Type, a, 0, -1, "etc/os-release")
			if !strings.Contains(got, "kiln test") {
				t.Errorf("etc/os-release read back as %q", got)
			}
		})
	}
}

// kiln bake documents SOURCE_DATE_EPOCH: with it in the environment the tools still run (mksquashfs
// refuses the variable beside its own timestamp options) and the image is the one the option asks for.
func TestMakeRootFSWithSourceDateEpoch(t *testing.T) {
	tree := smallTree(t)
	for _, typ := range []string{SquashFS, EROFS} {
		t.Run(typ, func(t *testing.T) {
			plain := filepath.Join(t.TempDir(), "plain.img")
			if err := MakeRootFS(t.Context(), tree, plain, RootFSOptions{Type: typ, SourceDateEpoch: 1000}); err != nil {
				t.Fatal(err)
			}
			t.Setenv("SOURCE_DATE_EPOCH", "1000")
			img := filepath.Join(t.TempDir(), "root.img")
			if err := MakeRootFS(t.Context(), tree, img, RootFSOptions{Type: typ, SourceDateEpoch: 1000}); err != nil {
				t.Fatalf("MakeRootFS with SOURCE_DATE_EPOCH set: %v", err)
			}
			a, _ := os.ReadFile(plain)
			b, _ := os.ReadFile(img)
			if !bytes.Equal(a, b) {
				t.Error("the image made with SOURCE_DATE_EPOCH in the environment differs from the one made without")
			}
		})
	}
}

// readBack returns the content of file in a root filesystem image that
// starts at offset bytes into img (size bytes long, or to the end when
// negative), read with the filesystem's own tools.
func readBack(t *testing.T, fsType, img string, offset, size int64, file string) string {
	t.Helper()
	if fsType == EROFS {
		if offset != 0 {
			img = extractRange(t, img, offset, size)
		}
		out := filepath.Join(t.TempDir(), "x")
		run(t, "fsck.erofs", "--extract="+out, img)
		b, err := os.ReadFile(filepath.Join(out, file))
		if err != nil {
			t.Fatalf("erofs image lacks %s: %v", file, err)
		}
		return string(b)
	}
	args := []string{"-cat"}
	if offset != 0 {
		args = append(args, "-o", itoa(offset))
	}
	return run(t, "unsquashfs", append(args, img, file)...)
}

func TestMakeRootFSPseudoFile(t *testing.T) {
	tree := smallTree(t)
	pf := filepath.Join(t.TempDir(), "owners.pf")
	if err := os.WriteFile(pf, []byte("home/user m 700 1000 1000\nhome/user/secret m 600 1000 1000\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	img := filepath.Join(t.TempDir(), "root.img")
	if err := MakeRootFS(context.Background(), tree, img, RootFSOptions{PseudoFile: pf}); err != nil {
		t.Fatal(err)
	}
	listing := run(t, "unsquashfs", "-lln", img)
	for _, want := range []string{"-rw------- 1000/1000", "drwx------ 1000/1000"} {
		if !strings.Contains(listing, want) {
			t.Errorf("listing lacks %q:\n%s", want, listing)
		}
	}
	if !strings.Contains(listing, "1970-01-01 00:00 squashfs-root/etc/os-release") {
		t.Errorf("file times are not the epoch 0:\n%s", listing)
	}
}

func TestMakeRootFSErrors(t *testing.T) {
	tree := smallTree(t)
	notDir := filepath.Join(tree, "etc/hostname")
	pseudo := func(body string) string {
		p := filepath.Join(t.TempDir(), "owners.pseudo")
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	owners := pseudo("/etc m 0755 0 0\n/etc/hostname m 0644 0 0\n")
	tests := []struct {
		name    string
		tree    string
		opts    RootFSOptions
		path    string // PATH to run with: "" keeps it, "empty", or "mkfs.erofs" alone
		wantErr []string
	}{
		{"missing tree", "/nonexistent/tree", RootFSOptions{}, "", []string{"/nonexistent/tree"}},
		{"tree is a file", notDir, RootFSOptions{}, "", []string{notDir, "not a directory"}},
		{"unknown type", tree, RootFSOptions{Type: "ext4"}, "", []string{`"ext4"`, "squashfs", "erofs"}},
		{"unknown squashfs codec", tree, RootFSOptions{Compression: "brotli"}, "", []string{`"brotli"`, "zstd"}},
		{"zstd level", tree, RootFSOptions{Level: 23}, "", []string{"23", "1..22"}},
		{"erofs codec", tree, RootFSOptions{Type: EROFS, Compression: "zstd"}, "", []string{`"zstd"`, "lz4hc"}},
		{"erofs device node", tree, RootFSOptions{Type: EROFS, PseudoFile: pseudo("/etc m 755 0 0\n/dev/console c 600 0 0 5 1\n")}, "",
			[]string{"pseudo file", "owners.pseudo:2", `"c"`, "/dev/console", "mkfs.erofs"}},
		{"erofs bad mode", tree, RootFSOptions{Type: EROFS, PseudoFile: pseudo("\"/etc/with space\" m 0999 0 0\n")}, "",
			[]string{"owners.pseudo:1", `"/etc/with space"`, `"0999"`}},
		{"erofs entry not in the tree", tree, RootFSOptions{Type: EROFS, PseudoFile: pseudo("/etc/gone m 644 0 0\n"), owners: ownersFakeroot}, "",
			[]string{"owners.pseudo:1", "/etc/gone", "no such file"}},
		{"erofs without root or fakeroot", tree, RootFSOptions{Type: EROFS, PseudoFile: owners, owners: ownersFakeroot}, "mkfs.erofs",
			[]string{"fakeroot", "apt-get install fakeroot", "bake as root"}},
		{"missing pseudo file", tree, RootFSOptions{PseudoFile: "/nonexistent/pf"}, "", []string{"/nonexistent/pf"}},
		{"no mksquashfs", tree, RootFSOptions{}, "empty", []string{"mksquashfs", "squashfs-tools"}},
		{"no mkfs.erofs", tree, RootFSOptions{Type: EROFS}, "empty", []string{"mkfs.erofs", "erofs-utils"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			switch tc.path {
			case "empty":
				t.Setenv("PATH", t.TempDir())
			case "mkfs.erofs":
				bin, err := exec.LookPath("mkfs.erofs")
				if err != nil {
					t.Skip("mkfs.erofs not installed")
				}
				dir := t.TempDir()
				if err := os.Symlink(bin, filepath.Join(dir, "mkfs.erofs")); err != nil {
					t.Fatal(err)
				}
				t.Setenv("PATH", dir)
			}
			out := filepath.Join(t.TempDir(), "root.img")
			err := MakeRootFS(context.Background(), tc.tree, out, tc.opts)
			if err == nil {
				t.Fatal("MakeRootFS succeeded, want an error")
			}
			for _, s := range tc.wantErr {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not mention %q", err, s)
				}
			}
			if _, err := os.Stat(out); err == nil {
				t.Errorf("%s left behind", out)
			}
		})
	}
}
