package vm

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestParseSize(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
	}{
		{"4G", 4 << 30}, {"512M", 512 << 20}, {"64k", 64 << 10}, {"64K", 64 << 10}, {"1T", 1 << 40}, {"1048576", 1 << 20},
	} {
		if got, err := ParseSize(tc.in); err != nil || got != tc.want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{"", "G", "4GiB", "1.5G", "-1G", "0", "4g", "99999999999T"} {
		if _, err := ParseSize(bad); err == nil || !strings.Contains(err.Error(), "e.g. 4G") {
			t.Errorf("ParseSize(%q) = %v, want an error saying what a size looks like", bad, err)
		}
	}
}

// virtualSizeOf asks qemu-img, as a user checking the disk would.
func virtualSizeOf(t *testing.T, p string) int64 {
	t.Helper()
	format, err := imageFormat(p)
	if err != nil {
		t.Fatal(err)
	}
	n, err := virtualSize(context.Background(), p, format)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// newDisk creates a disk image of format and size with qemu-img, as a bake's outputs are.
func newDisk(t *testing.T, name, format, size string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", format, p, size).CombinedOutput(); err != nil {
		t.Fatalf("qemu-img create: %v: %s", err, out)
	}
	return p
}

// A disk baked only as large as its partitions grows to the size asked for, in its own
// format, and a disk already that large or larger is left alone: growing never shrinks.
func TestGrowDisk(t *testing.T) {
	for _, format := range []string{"raw", "qcow2"} {
		t.Run(format, func(t *testing.T) {
			p := newDisk(t, "disk."+format, format, "3M")
			for _, step := range []struct {
				size  string
				grown bool
				want  int64
			}{
				{"8M", true, 8 << 20},
				{"8M", false, 8 << 20},
				{"4M", false, 8 << 20},
			} {
				grown, err := GrowDisk(context.Background(), p, step.size)
				if err != nil {
					t.Fatalf("GrowDisk %s: %v", step.size, err)
				}
				if got := virtualSizeOf(t, p); grown != step.grown || got != step.want {
					t.Errorf("GrowDisk %s: grown %v, size %d; want %v, %d", step.size, grown, got, step.grown, step.want)
				}
			}
		})
	}
	if _, err := GrowDisk(context.Background(), filepath.Join(t.TempDir(), "none.raw"), "8M"); err == nil || !strings.Contains(err.Error(), "none.raw") {
		t.Errorf("GrowDisk of a missing file = %v, want an error naming it", err)
	}
	p := newDisk(t, "disk.raw", "raw", "1M")
	if _, err := GrowDisk(context.Background(), p, "8 GiB"); err == nil || !strings.Contains(err.Error(), `"8 GiB"`) {
		t.Errorf("GrowDisk with a bad size = %v, want an error naming the size", err)
	}
}

// rootDrive is the -drive value of Args that attaches the root disk.
func rootDrive(t *testing.T, cfg Config, work string) string {
	t.Helper()
	cfg.Accel = "tcg"
	args, err := Args(context.Background(), cfg, work)
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(args, func(a string) bool { return strings.HasPrefix(a, "if=none,id=root,") })
	if i < 0 {
		t.Fatalf("no root drive in %q", args)
	}
	return args[i]
}

// RootSize grows the image a machine boots; with Snapshot the image keeps its bytes and the
// guest writes, on a disk of RootSize, to an overlay in the work directory.
func TestRootSize(t *testing.T) {
	t.Run("in place", func(t *testing.T) {
		img := newDisk(t, "node.raw", "raw", "3M")
		drive := rootDrive(t, Config{Image: img, RootSize: "16M"}, t.TempDir())
		if !strings.Contains(drive, "format=raw,file="+img) || strings.Contains(drive, "snapshot") {
			t.Errorf("root drive %q: want the image itself, raw", drive)
		}
		if got := virtualSizeOf(t, img); got != 16<<20 {
			t.Errorf("image is %d bytes after the boot's setup, want %d", got, 16<<20)
		}
	})
	t.Run("snapshot", func(t *testing.T) {
		img := newDisk(t, "node.raw", "raw", "3M")
		if err := os.WriteFile(img, []byte("the image's bytes"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(img, 3<<20); err != nil {
			t.Fatal(err)
		}
		work := t.TempDir()
		drive := rootDrive(t, Config{Image: img, Snapshot: true, RootSize: "16M"}, work)
		overlay := filepath.Join(work, "root-overlay.qcow2")
		if !strings.Contains(drive, "format=qcow2,file="+overlay) || strings.Contains(drive, "snapshot=on") {
			t.Errorf("root drive %q: want the overlay %s, qcow2", drive, overlay)
		}
		if got := virtualSizeOf(t, overlay); got != 16<<20 {
			t.Errorf("overlay is %d bytes, want %d", got, 16<<20)
		}
		if got := virtualSizeOf(t, img); got != 3<<20 {
			t.Errorf("image is %d bytes after a snapshot boot's setup, want it unchanged (%d)", got, 3<<20)
		}
		// The overlay reads through to the image.
		flat := filepath.Join(t.TempDir(), "flat.raw")
		if out, err := exec.Command("qemu-img", "convert", "-f", "qcow2", "-O", "raw", overlay, flat).CombinedOutput(); err != nil {
			t.Fatalf("qemu-img convert: %v: %s", err, out)
		}
		if data, err := os.ReadFile(flat); err != nil || !strings.HasPrefix(string(data), "the image's bytes") {
			t.Errorf("the overlay does not read through to the image: %.20q, %v", data, err)
		}
		// A second start makes a fresh overlay: nothing of the last guest's writes.
		if err := os.WriteFile(overlay, []byte("stale"), 0o644); err != nil {
			t.Fatal(err)
		}
		rootDrive(t, Config{Image: img, Snapshot: true, RootSize: "16M"}, work)
		if got := virtualSizeOf(t, overlay); got != 16<<20 {
			t.Errorf("overlay after a second start is %d bytes, want a fresh one of %d", got, 16<<20)
		}
	})
	t.Run("snapshot of a larger image", func(t *testing.T) {
		img := newDisk(t, "node.qcow2", "qcow2", "32M")
		work := t.TempDir()
		rootDrive(t, Config{Image: img, Snapshot: true, RootSize: "16M"}, work)
		if got := virtualSizeOf(t, filepath.Join(work, "root-overlay.qcow2")); got != 32<<20 {
			t.Errorf("overlay is %d bytes, want the image's 32 MiB (never smaller)", got)
		}
	})
	t.Run("diskless", func(t *testing.T) {
		_, err := Args(context.Background(), Config{Accel: "tcg", NetBoot: &NetBoot{BootFile: "http://10.0.2.2:8080/boot.ipxe"}, RootSize: "4G"}, t.TempDir())
		if err == nil || !strings.Contains(err.Error(), "diskless") {
			t.Errorf("RootSize without an image = %v, want an error", err)
		}
	})
}
