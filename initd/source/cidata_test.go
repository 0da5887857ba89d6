package source

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kilnproject/kiln/internal/testkit"
)

// seedTree writes files (path → content) under a new directory.
func seedTree(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		writeFile(t, filepath.Join(dir, name), []byte(content))
	}
	return dir
}

type imageMaker func(t *testing.T, label string, files map[string]string) string

func isoWith(tool string, flags ...string) imageMaker {
	return func(t *testing.T, label string, files map[string]string) string {
		t.Helper()
		img := filepath.Join(t.TempDir(), "seed.iso")
		args := []string{"-quiet", "-o", img, "-V", label}
		if tool == "xorriso" {
			args = append([]string{"-as", "mkisofs"}, args...)
		}
		testkit.Run(t, tool, append(append(args, flags...), seedTree(t, files))...)
		return img
	}
}

func fatWith(sizeMB int, flags ...string) imageMaker {
	return func(t *testing.T, label string, files map[string]string) string {
		t.Helper()
		img := filepath.Join(t.TempDir(), "seed.img")
		f, err := os.Create(img)
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Truncate(int64(sizeMB) << 20); err != nil {
			t.Fatal(err)
		}
		f.Close()
		testkit.Run(t, "mkfs.vfat", append(append([]string{"-n", label}, flags...), img)...)
		tree := seedTree(t, files)
		entries, err := os.ReadDir(tree)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			testkit.Run(t, "mcopy", "-s", "-i", img, filepath.Join(tree, e.Name()), "::/")
		}
		return img
	}
}

// byLabel makes a by-label directory with label → img.
func byLabel(t *testing.T, label, img string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.Symlink(img, filepath.Join(dir, label)); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestCIDATA(t *testing.T) {
	nocloud := map[string]string{"user-data": butane, "meta-data": "instance-id: i-1\n"}
	configDrive := map[string]string{
		"openstack/latest/user_data":      ign,
		"openstack/latest/meta_data.json": `{"uuid":"x"}`,
	}
	tests := []struct {
		name    string
		tool    string
		pkg     string
		make    imageMaker
		label   string
		files   map[string]string
		want    string
		wantErr string
	}{
		{name: "iso rock ridge and joliet (genisoimage)", tool: "genisoimage", pkg: "genisoimage",
			make: isoWith("genisoimage", "-J", "-r"), label: "cidata", files: nocloud, want: butane},
		{name: "iso joliet only (xorriso)", tool: "xorriso", pkg: "xorriso",
			make: isoWith("xorriso", "-J"), label: "cidata", files: nocloud, want: butane},
		{name: "iso rock ridge only (xorriso)", tool: "xorriso", pkg: "xorriso",
			make: isoWith("xorriso", "-r"), label: "CIDATA", files: nocloud, want: butane},
		{name: "fat12, mkfs.vfat's choice for 1 MiB", tool: "mkfs.vfat", pkg: "dosfstools",
			make: fatWith(1), label: "CIDATA", files: nocloud, want: butane},
		{name: "fat16", tool: "mkfs.vfat", pkg: "dosfstools",
			make: fatWith(32, "-F", "16"), label: "CIDATA", files: nocloud, want: butane},
		{name: "fat32", tool: "mkfs.vfat", pkg: "dosfstools",
			make: fatWith(64, "-F", "32"), label: "CIDATA", files: nocloud, want: butane},
		{name: "config drive iso", tool: "genisoimage", pkg: "genisoimage",
			make: isoWith("genisoimage", "-J", "-r"), label: "config-2", files: configDrive, want: ign},
		{name: "config drive fat", tool: "mkfs.vfat", pkg: "dosfstools",
			make: fatWith(1), label: "config-2", files: configDrive, want: ign},
		{name: "meta-data only: no config", tool: "genisoimage", pkg: "genisoimage",
			make: isoWith("genisoimage", "-J", "-r"), label: "cidata", files: map[string]string{"meta-data": "instance-id: i-1\n"}},
		{name: "unreadable volume", label: "CIDATA",
			make: func(t *testing.T, _ string, _ map[string]string) string {
				img := filepath.Join(t.TempDir(), "junk")
				writeFile(t, img, randomBytes(1<<20))
				return img
			}, wantErr: "want ISO9660 or FAT"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.tool != "" {
				testkit.Tool(t, tc.tool, tc.pkg)
				if strings.HasPrefix(tc.tool, "mkfs") {
					testkit.Tool(t, "mcopy", "mtools")
				}
			}
			img := tc.make(t, tc.label, tc.files)
			c := CIDATA{ByLabel: byLabel(t, tc.label, img)}
			if !c.Probe(context.Background()) {
				t.Fatal("Probe = false, want true")
			}
			data, err := c.Fetch(context.Background())
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Fetch = %q, %v; want error %q", data, err, tc.wantErr)
				}
				return
			}
			if err != nil || string(data) != tc.want {
				t.Fatalf("Fetch = %q, %v; want %q", data, err, tc.want)
			}
			// The image is untouched: read-only access.
			if fi, err := os.Stat(img); err != nil || fi.Size() == 0 {
				t.Errorf("image changed: %v", err)
			}
		})
	}
}

func TestCIDATAProbe(t *testing.T) {
	tests := []struct {
		name string
		dir  func(t *testing.T) string
		want bool
	}{
		{"no by-label directory", func(t *testing.T) string { return filepath.Join(t.TempDir(), "none") }, false},
		{"other labels only", func(t *testing.T) string { return byLabel(t, "ESP", "/dev/null") }, false},
		{"dangling CIDATA link", func(t *testing.T) string { return byLabel(t, "CIDATA", "/nonexistent") }, false},
		{"CIDATA", func(t *testing.T) string { return byLabel(t, "CIDATA", "/dev/null") }, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := (CIDATA{ByLabel: tc.dir(t)}).Probe(context.Background()); got != tc.want {
				t.Errorf("Probe = %v, want %v", got, tc.want)
			}
		})
	}
}

// On a node the CIDATA volume is a block device, which reports 512-byte sectors; an ISO9660
// volume there must still be read (a loop device stands in for the disk).
func TestCIDATAOnBlockDevice(t *testing.T) {
	testkit.RequireRoot(t, "loop devices")
	testkit.Tool(t, "genisoimage", "genisoimage")
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "src"), 0o755)
	os.WriteFile(filepath.Join(dir, "src", "user-data"), []byte(`{"ignition":{"version":"3.4.0"}}`), 0o644)
	iso := filepath.Join(dir, "cidata.iso")
	if out, err := exec.Command("genisoimage", "-quiet", "-V", "cidata", "-J", "-r", "-o", iso, filepath.Join(dir, "src")).CombinedOutput(); err != nil {
		t.Fatalf("genisoimage: %v: %s", err, out)
	}
	out, err := exec.Command("losetup", "--find", "--show", "--read-only", iso).Output()
	if err != nil {
		t.Skipf("no loop device here: %v", err)
	}
	loop := strings.TrimSpace(string(out))
	t.Cleanup(func() { exec.Command("losetup", "-d", loop).Run() })
	byLabel := filepath.Join(dir, "by-label")
	os.MkdirAll(byLabel, 0o755)
	if err := os.Symlink(loop, filepath.Join(byLabel, "cidata")); err != nil {
		t.Fatal(err)
	}
	got, err := CIDATA{ByLabel: byLabel}.Fetch(context.Background())
	if err != nil || !strings.Contains(string(got), `"ignition"`) {
		t.Fatalf("Fetch from %s = %q, %v", loop, got, err)
	}
}
