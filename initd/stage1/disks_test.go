package stage1

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kilnproject/kiln/initd/blockdev"
	"github.com/kilnproject/kiln/internal/testkit"
)

// fakeSys lays out a /sys/block and /dev pair: each disk name maps to an image file (its node is a
// symlink to it) and its partition numbers.
func fakeSys(t *testing.T, disks map[string]string, parts map[string][]string) (sysBlock, dev string) {
	t.Helper()
	root := t.TempDir()
	sysBlock, dev = filepath.Join(root, "sys/block"), filepath.Join(root, "dev")
	write := func(p, c string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(dev, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, img := range disks {
		fi, err := os.Stat(img)
		if err != nil {
			t.Fatal(err)
		}
		write(filepath.Join(sysBlock, name, "size"), strconv.FormatInt(fi.Size()/512, 10)+"\n")
		write(filepath.Join(sysBlock, name, "queue/logical_block_size"), "512\n")
		if err := os.Symlink(img, filepath.Join(dev, name)); err != nil {
			t.Fatal(err)
		}
		for i, pn := range parts[name] {
			write(filepath.Join(sysBlock, name, pn, "partition"), strconv.FormatInt(int64(i+1), 10)+"\n")
			write(filepath.Join(dev, pn), "")
		}
	}
	// An empty loop device: no size, skipped.
	write(filepath.Join(sysBlock, "loop0/size"), "0\n")
	return sysBlock, dev
}

func TestScanDisksFindsRoot(t *testing.T) {
	img := makeImage(t, imageSize)
	sysBlock, dev := fakeSys(t,
		map[string]string{"vda": testkit.SparseFile(t, 8*mib), "nvme0n1": img},
		map[string][]string{"nvme0n1": {"nvme0n1p1", "nvme0n1p2", "nvme0n1p3"}})
	disks, err := blockdev.ScanDisks(sysBlock, dev)
	if err != nil {
		t.Fatal(err)
	}
	if len(disks) != 2 {
		t.Fatalf("found %d disks, want nvme0n1 and vda (loop0 has no size): %v", len(disks), disks)
	}
	d, p, ok := blockdev.FindPartition(disks, strings.ToUpper(rootAGUID))
	if !ok || d.Name != "nvme0n1" || p.Index != 2 || p.Name != "root-a" || p.GUID != rootAGUID {
		t.Fatalf("FindPartition = %+v %+v %v, want nvme0n1 partition 2 root-a", d, p, ok)
	}
	if d.Size != imageSize || d.SectorSize != 512 || len(d.Partitions) != 3 {
		t.Errorf("disk %+v", d)
	}
	dp, ok := blockdev.PartitionDevice(sysBlock, dev, "nvme0n1", 2)
	if !ok || dp != filepath.Join(dev, "nvme0n1p2") {
		t.Errorf("partitionDevice = %q %v, want %s/nvme0n1p2", dp, ok, dev)
	}
	if _, ok := blockdev.PartitionDevice(sysBlock, dev, "nvme0n1", 4); ok {
		t.Error("partitionDevice found partition 4 that the kernel does not know")
	}
	for _, d := range disks {
		if d.Name == "vda" && d.Err == nil {
			t.Error("vda has no GPT but no error was recorded")
		}
	}
}

func TestWaitForRootNotFound(t *testing.T) {
	img := makeImage(t, imageSize)
	sysBlock, dev := fakeSys(t, map[string]string{"vda": img, "vdb": testkit.SparseFile(t, 8*mib)}, nil)
	const missing = "11111111-2222-3333-4444-555555555555"
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	start := time.Now()
	_, _, _, err := waitForRoot(context.Background(), log, sysBlock, dev, missing, 600*time.Millisecond)
	// At least the timeout; the upper bound only tells a bounded wait from a hang.
	if took := time.Since(start); took < 600*time.Millisecond || took > time.Minute {
		t.Errorf("waited %s, want about 600ms", took)
	}
	var nf *rootNotFoundError
	if !errors.As(err, &nf) {
		t.Fatalf("error = %v, want *RootNotFoundError", err)
	}
	nf.cmdline = "root=PARTUUID=" + missing + " ro kiln.platform=qemu"
	nf.modules = []moduleError{{path: "/lib/modules/x/virtio_blk.ko", err: os.ErrNotExist}}
	msg := err.Error()
	for _, want := range []string{
		"root partition PARTUUID=" + missing + " not found",
		"cmdline: root=PARTUUID=" + missing + " ro kiln.platform=qemu",
		filepath.Join(dev, "vda") + " (268435456 bytes",
		`2 "root-a" partuuid=` + rootAGUID,
		`1 "ESP" partuuid=`, `3 "root-b" partuuid=`,
		filepath.Join(dev, "vdb") + " (8388608 bytes, 512-byte sectors): no GPT",
		"load module /lib/modules/x/virtio_blk.ko: file does not exist",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("error message lacks %q:\n%s", want, msg)
		}
	}
}

func TestWaitForRootAppearsLate(t *testing.T) {
	img := makeImage(t, imageSize)
	sysBlock, dev := fakeSys(t, nil, nil)
	go func() {
		time.Sleep(300 * time.Millisecond)
		_ = os.MkdirAll(filepath.Join(sysBlock, "vdc/queue"), 0o755)
		_ = os.Symlink(img, filepath.Join(dev, "vdc"))
		_ = os.WriteFile(filepath.Join(sysBlock, "vdc/size"), []byte(strconv.FormatInt(imageSize/512, 10)), 0o644)
	}()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	d, p, _, err := waitForRoot(context.Background(), log, sysBlock, dev, rootAGUID, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if d.Name != "vdc" || p.Name != "root-a" {
		t.Errorf("found %s partition %q, want vdc root-a", d.Name, p.Name)
	}
}
