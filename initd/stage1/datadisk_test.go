package stage1

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kilnproject/kiln/initd/blockdev"
	"github.com/kilnproject/kiln/initd/etcdvolume"
	"github.com/kilnproject/kiln/internal/nodeimage"
	"github.com/kilnproject/kiln/internal/testkit"
)

// Disks for the /var choice, each a real sparse file written with the real tools.
type diskMaker func(t *testing.T) string

// liveDiskSize leaves room for the smallest data partition.
const liveDiskSize = 96 * mib

func blankDisk(t *testing.T) string { return testkit.SparseFile(t, liveDiskSize) }

// ext4WithFile is a whole-disk ext4 filesystem holding a file, as a user's disk might.
func ext4WithFile(t *testing.T) string {
	src := t.TempDir()
	os.WriteFile(filepath.Join(src, "precious.txt"), []byte("keep me\n"), 0o644)
	img := testkit.SparseFile(t, liveDiskSize)
	testkit.Run(t, testkit.Tool(t, "mkfs.ext4", "e2fsprogs"), "-q", "-F", "-d", src, img)
	return img
}

// kilnDisk is an installed kiln disk: ESP, root-a, root-b.
func kilnDisk(t *testing.T) string { return makeImage(t, imageSize) }

// sgdiskDisk is a disk a user partitioned with sgdisk: one Linux partition, nothing in it.
func sgdiskDisk(t *testing.T) string {
	img := testkit.SparseFile(t, liveDiskSize)
	sgdisk(t, "-n", "1:0:0", "-t", "1:8300", "-c", "1:scratch", img)
	return img
}

// tailData is blank but for a few bytes near its end that no probe names.
func tailData(t *testing.T) string {
	img := testkit.SparseFile(t, liveDiskSize)
	f, _ := os.OpenFile(img, os.O_WRONLY, 0)
	f.WriteAt([]byte("kiln"), liveDiskSize-300<<10)
	f.Close()
	return img
}

// backupGPTOnly is a disk whose primary GPT was wiped (wipefs of the first MiB, say): only the
// backup at the end is left.
func backupGPTOnly(t *testing.T) string {
	img := sgdiskDisk(t)
	f, _ := os.OpenFile(img, os.O_WRONLY, 0)
	f.WriteAt(make([]byte, mib), 0)
	f.Close()
	return img
}

// liveDataDisk is the data disk an earlier live boot made: newDataDisk, then ext4 labelled
// nodeimage.DataLabel in the partition (label is that label unless given).
func liveDataDisk(label string) diskMaker {
	return func(t *testing.T) string {
		img := testkit.SparseFile(t, liveDiskSize)
		p, err := newDataDisk(img, 512)
		if err != nil {
			t.Fatal(err)
		}
		if label == "-" {
			return img // interrupted before mkfs: the partition is blank
		}
		fs := testkit.SparseFile(t, int64(p.End-p.Start+1)*512)
		testkit.Run(t, testkit.Tool(t, "mkfs.ext4", "e2fsprogs"), "-q", "-F", "-L", label, fs)
		copyInto(t, fs, img, int64(p.Start)*512)
		return img
	}
}

func copyInto(t *testing.T, src, dst string, off int64) {
	t.Helper()
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	// Only the first 16 MiB: enough for the superblock and the group descriptors.
	if _, err := io.Copy(io.NewOffsetWriter(out, off), io.LimitReader(in, 16*mib)); err != nil {
		t.Fatal(err)
	}
}

func TestChooseVar(t *testing.T) {
	testkit.Tools(t, "sgdisk", "mkfs.ext4")
	mainEtcd := &etcdvolume.Selection{Serial: "etcd-main"}
	tests := []struct {
		name     string
		disks    map[string]diskMaker
		ro       []string              // disks whose sysfs ro is 1
		serials  map[string]string     // the disks' virtio serials
		etcd     *etcdvolume.Selection // the node config's etcd volume
		wantKind string
		wantDisk string
		wantWhy  string
		skipped  []string
		unseen   bool // chosen while the etcd volume is not seen
	}{
		{
			name: "only disks holding something: tmpfs",
			disks: map[string]diskMaker{"vda": kilnDisk, "vdb": ext4WithFile, "vdc": sgdiskDisk, "vdd": tailData,
				"vde": backupGPTOnly},
			wantKind: varTmpfs, wantWhy: "no blank disk: /var is in RAM and is lost at reboot",
			skipped: []string{`vda: holds a GPT with 3 partitions ("ESP", "root-a", "root-b")`, "vdb: holds ext4",
				`vdc: holds a GPT with 1 partitions ("scratch")`, "vdd: holds data in its last MiB", `vde: holds a GPT with 1 partitions ("scratch")`},
		},
		{
			name:     "no disk at all: tmpfs",
			wantKind: varTmpfs, wantWhy: "no blank disk",
		},
		{
			name:     "the blank disk beside a filesystem",
			disks:    map[string]diskMaker{"sda": ext4WithFile, "sdb": blankDisk},
			wantKind: varBlank, wantDisk: "sdb", wantWhy: "sdb is the first blank disk: it gets a GPT with one data partition",
			skipped: []string{"sda: holds ext4"},
		},
		{
			name:     "the first of two blank disks, naming the other",
			disks:    map[string]diskMaker{"vdc": blankDisk, "vdb": blankDisk},
			wantKind: varBlank, wantDisk: "vdb", wantWhy: "vdc stay blank; kiln.data.dev= names the disk to use",
		},
		{
			name:     "an earlier live boot's data disk before a blank disk",
			disks:    map[string]diskMaker{"vda": blankDisk, "vdb": liveDataDisk(nodeimage.DataLabel)},
			wantKind: varDataDisk, wantDisk: "vdb", wantWhy: "vdb is the kiln data disk of an earlier live boot",
		},
		{
			name:     "a data disk whose mkfs was cut short",
			disks:    map[string]diskMaker{"vdb": liveDataDisk("-")},
			wantKind: varDataDisk, wantDisk: "vdb",
		},
		{
			name:     "a data partition with someone else's ext4 is not ours",
			disks:    map[string]diskMaker{"vdb": liveDataDisk("backups")},
			wantKind: varTmpfs, skipped: []string{`vdb: holds a data partition with ext4 labelled "backups", not "kiln-data"`},
		},
		{
			name:     "never the etcd volume, blank and first",
			disks:    map[string]diskMaker{"vda": blankDisk, "vdb": blankDisk},
			serials:  map[string]string{"vda": "etcd-main", "vdb": "os"},
			etcd:     mainEtcd,
			wantKind: varBlank, wantDisk: "vdb", wantWhy: "vdb is the first blank disk",
			skipped: []string{"vda: the etcd volume (etcd.volume.serial=etcd-main)"},
		},
		{
			name:     "never the etcd volume, by its by-id name",
			disks:    map[string]diskMaker{"vda": blankDisk},
			serials:  map[string]string{"vda": "etcd-main"},
			etcd:     &etcdvolume.Selection{ByID: "virtio-etcd-main"},
			wantKind: varTmpfs, wantWhy: "no blank disk",
			skipped: []string{"vda: the etcd volume (etcd.volume.byId=virtio-etcd-main)"},
		},
		{
			name:     "never the etcd volume, even a data disk of an earlier live boot",
			disks:    map[string]diskMaker{"vda": liveDataDisk(nodeimage.DataLabel), "vdb": blankDisk},
			serials:  map[string]string{"vda": "etcd-main"},
			etcd:     mainEtcd,
			wantKind: varBlank, wantDisk: "vdb",
			skipped: []string{"vda: the etcd volume (etcd.volume.serial=etcd-main)"},
		},
		{
			name:     "no blank disk while the etcd volume is not seen",
			disks:    map[string]diskMaker{"vda": blankDisk, "vdb": ext4WithFile},
			serials:  map[string]string{"vda": "os"},
			etcd:     mainEtcd,
			wantKind: varTmpfs, wantWhy: "the node config's etcd.volume.serial=etcd-main selects none of the disks, so no blank disk is taken",
			skipped: []string{"vda: blank, and may be the etcd volume: the node config's etcd.volume.serial=etcd-main selects none of the disks", "vdb: holds ext4"},
			unseen:  true,
		},
		{
			name:     "a data disk of an earlier live boot while the etcd volume is not seen",
			disks:    map[string]diskMaker{"vda": blankDisk, "vdb": liveDataDisk(nodeimage.DataLabel)},
			etcd:     mainEtcd,
			wantKind: varDataDisk, wantDisk: "vdb",
		},
		{
			name:     "a read-only blank disk is not used",
			disks:    map[string]diskMaker{"vdb": blankDisk},
			ro:       []string{"vdb"},
			wantKind: varTmpfs, skipped: []string{"vdb: read-only"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			imgs := map[string]string{}
			for name, mk := range tt.disks {
				imgs[name] = mk(t)
			}
			// The live root's loop device has a size but is never a candidate.
			imgs["loop0"] = testkit.SparseFile(t, 64*mib)
			sysBlock, dev := fakeSys(t, imgs, nil)
			for _, name := range tt.ro {
				os.WriteFile(filepath.Join(sysBlock, name, "ro"), []byte("1\n"), 0o644)
			}
			for name, serial := range tt.serials {
				os.WriteFile(filepath.Join(sysBlock, name, "serial"), []byte(serial+"\n"), 0o644)
			}
			before := map[string]string{}
			for name, img := range imgs {
				before[name] = testkit.FileSHA256(t, img)
			}
			got, err := chooseVar(sysBlock, dev, "", tt.etcd)
			if err != nil {
				t.Fatal(err)
			}
			if unseen := got.etcdUnseen != ""; unseen != tt.unseen {
				t.Errorf("chosen while the etcd volume is not seen: %v, want %v", unseen, tt.unseen)
			}
			if got.kind != tt.wantKind || got.disk.Name != tt.wantDisk {
				t.Errorf("chose %s %q (%s), want %s %q", got.kind, got.disk.Name, got.why, tt.wantKind, tt.wantDisk)
			}
			if !strings.Contains(got.why, tt.wantWhy) {
				t.Errorf("why = %q, want it to contain %q", got.why, tt.wantWhy)
			}
			skipped := strings.Join(got.skipped, "\n")
			for _, s := range tt.skipped {
				if !strings.Contains(skipped, filepath.Join(dev, s)) {
					t.Errorf("skipped lacks %q:\n%s", filepath.Join(dev, s), skipped)
				}
			}
			if strings.Contains(skipped, "loop0") {
				t.Errorf("loop0 was considered: %s", skipped)
			}
			for name, img := range imgs {
				if testkit.FileSHA256(t, img) != before[name] {
					t.Errorf("choosing changed %s", name)
				}
			}
		})
	}
}

func TestNewDataDisk(t *testing.T) {
	testkit.Tools(t, "sgdisk", "blkid")
	for _, size := range []int64{256 * mib, 3 << 40} {
		img := testkit.SparseFile(t, size)
		p, err := newDataDisk(img, 512)
		if err != nil {
			t.Fatal(err)
		}
		if p.Index != 1 || p.Start != 2048 || (p.End+1)%2048 != 0 || p.Name != nodeimage.DataName || p.Type != nodeimage.TypeLinuxData {
			t.Errorf("partition %+v, want 1 %q from sector 2048 to a MiB boundary", p, nodeimage.DataName)
		}
		if lastMiB := uint64(size/512) - 2048; p.End < lastMiB-2048 {
			t.Errorf("partition ends at sector %d, more than 1 MiB before the backup GPT (disk %d sectors)", p.End, size/512)
		}
		if out := sgdisk(t, "-v", img); !strings.Contains(out, "No problems found") {
			t.Errorf("sgdisk -v on a %d-byte disk:\n%s", size, out)
		}
		if out := testkit.Run(t, "blkid", "-p", "-o", "value", "-s", "PTTYPE", img); strings.TrimSpace(out) != "gpt" {
			t.Errorf("blkid PTTYPE = %q", out)
		}
		if kind, what := classifyDisk(blockdev.Disk{Path: img, SectorSize: 512, Partitions: []blockdev.Partition{p}}); kind != diskData {
			t.Errorf("the new disk is not recognised as a data disk: %s", what)
		}
	}
}

func TestChooseNamed(t *testing.T) {
	testkit.Tools(t, "sgdisk", "mkfs.ext4")
	imgs := map[string]string{
		"vda": kilnDisk(t), "vdb": blankDisk(t), "nvme0n1": blankDisk(t), "sda": blankDisk(t), "sdb": ext4WithFile(t),
		"vdc": sgdiskDisk(t), "vdd": sgdiskDisk(t),
	}
	sysBlock, dev := fakeSys(t, imgs, map[string][]string{"vdc": {"vdc1"}, "vdd": {"vdd1"}})
	write := func(p string, b []byte) { os.MkdirAll(filepath.Dir(p), 0o755); os.WriteFile(p, b, 0o644) }
	write(filepath.Join(sysBlock, "vdb/serial"), []byte("data1\n"))
	write(filepath.Join(sysBlock, "vdd/serial"), []byte("etcd-main\n"))
	write(filepath.Join(sysBlock, "nvme0n1/device/model"), []byte("QEMU NVMe Ctrl                          \n"))
	write(filepath.Join(sysBlock, "nvme0n1/device/serial"), []byte("nv-7    \n"))
	write(filepath.Join(sysBlock, "sda/device/vendor"), []byte("QEMU    \n"))
	write(filepath.Join(sysBlock, "sda/device/model"), []byte("QEMU HARDDISK   \n"))
	write(filepath.Join(sysBlock, "sda/device/vpd_pg80"), append([]byte{0, 0x80, 0, 4}, "sd-1"...))
	write(filepath.Join(sysBlock, "sdb/device/vendor"), []byte("ATA     \n"))
	write(filepath.Join(sysBlock, "sdb/device/model"), []byte("Samsung SSD 870\n"))
	write(filepath.Join(sysBlock, "sdb/device/vpd_pg80"), append([]byte{0, 0x80, 0, 6}, "S5Y1NX"...))
	// The partition node of vdc1 is the blank partition sgdisk made: a file of its size.
	write(filepath.Join(dev, "vdc1"), nil)
	os.Truncate(filepath.Join(dev, "vdc1"), 8*mib)

	tests := []struct {
		dataDev      string
		disk, part   string
		blank        bool
		wantErr      string
		wantNotFound bool
	}{
		{dataDev: "virtio-data1", disk: "vdb", blank: true},
		{dataDev: "/dev/disk/by-id/virtio-data1", disk: "vdb", blank: true},
		{dataDev: "nvme-QEMU_NVMe_Ctrl_nv-7", disk: "nvme0n1", blank: true},
		{dataDev: "scsi-0QEMU_QEMU_HARDDISK_sd-1", disk: "sda", blank: true},
		{dataDev: "scsi-SQEMU_QEMU_HARDDISK_sd-1", disk: "sda", blank: true},
		{dataDev: "/dev/vdb", disk: "vdb", blank: true},
		{dataDev: "/dev/vdc1", part: "vdc1"},
		{dataDev: "ata-Samsung_SSD_870_S5Y1NX", wantErr: "sdb holds ext4: refusing to put /var on it (wipe it to use it)"},
		{dataDev: "/dev/vda", wantErr: `vda holds a GPT with 3 partitions ("ESP", "root-a", "root-b"): refusing`},
		{dataDev: "virtio-nothere", wantErr: "no disk has the by-id name virtio-nothere (disks: ", wantNotFound: true},
		{dataDev: "/dev/vdz", wantErr: "no disk or partition /dev/vdz", wantNotFound: true},
		{dataDev: "virtio-etcd-main", wantErr: "vdd is the etcd volume (etcd.volume.serial=etcd-main): /var never goes on it"},
		{dataDev: "/dev/vdd", wantErr: "vdd is the etcd volume (etcd.volume.serial=etcd-main)"},
		{dataDev: "/dev/vdd1", wantErr: "vdd is the etcd volume (etcd.volume.serial=etcd-main)"},
		{dataDev: "virtio-etcd-main-part1", wantErr: "vdd is the etcd volume (etcd.volume.serial=etcd-main)"},
	}
	for _, tt := range tests {
		t.Run(tt.dataDev, func(t *testing.T) {
			got, err := chooseVar(sysBlock, dev, tt.dataDev, &etcdvolume.Selection{Serial: "etcd-main"})
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !strings.HasPrefix(err.Error(), "kiln.data.dev="+tt.dataDev+": ") {
					t.Fatalf("chooseVar error = %v, want kiln.data.dev=%s: …%s", err, tt.dataDev, tt.wantErr)
				}
				if tt.wantNotFound != errors.Is(err, errNotFound) {
					t.Errorf("errors.Is(err, errNotFound) = %v, want %v", !tt.wantNotFound, tt.wantNotFound)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.kind != varNamed || got.disk.Name != tt.disk || got.blank != tt.blank {
				t.Errorf("chose %+v, want disk %q blank %v", got, tt.disk, tt.blank)
			}
			if tt.part != "" && got.partition != filepath.Join(dev, tt.part) {
				t.Errorf("partition = %q, want %s", got.partition, filepath.Join(dev, tt.part))
			}
		})
	}
}

// TestWaitChooseVarEtcd: while the node config's etcd volume selects none of the disks, no
// blank disk is taken: the choice waits up to kiln.rootwait= for it (the kernel may still be
// probing it), then takes another blank disk, never the etcd volume, and says which it passed
// over; when the etcd volume never appears, /var is in RAM and the console says why.
func TestWaitChooseVarEtcd(t *testing.T) {
	etcd := &etcdvolume.Selection{Serial: "etcd-main"}
	tests := []struct {
		name     string
		late     bool // the etcd volume appears after 300ms; else never
		wait     time.Duration
		wantKind string
		wantLog  []string
	}{
		{name: "the etcd volume appears late", late: true, wait: 10 * time.Second, wantKind: varBlank,
			wantLog: []string{`msg="not for /var: DEV/vda: the etcd volume (etcd.volume.serial=etcd-main)"`, `msg="/var: DEV/vdb is the first blank disk`}},
		{name: "the etcd volume never appears", wait: 500 * time.Millisecond, wantKind: varTmpfs,
			wantLog: []string{`msg="not for /var: DEV/vdb: blank, and may be the etcd volume`,
				`level=WARN msg="the node config's etcd.volume.serial=etcd-main selects none of the disks, so no blank disk is taken`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sysBlock, dev := fakeSys(t, map[string]string{"vdb": blankDisk(t)}, nil)
			os.WriteFile(filepath.Join(sysBlock, "vdb/serial"), []byte("os\n"), 0o644)
			lateSys, lateDev := fakeSys(t, map[string]string{"vda": blankDisk(t)}, nil)
			os.WriteFile(filepath.Join(lateSys, "vda/serial"), []byte("etcd-main\n"), 0o644)
			if tt.late {
				go func() {
					time.Sleep(300 * time.Millisecond)
					os.Rename(filepath.Join(lateDev, "vda"), filepath.Join(dev, "vda"))
					os.Rename(filepath.Join(lateSys, "vda"), filepath.Join(sysBlock, "vda"))
				}()
			}
			var logs bytes.Buffer
			start := time.Now()
			got, err := waitChooseVar(context.Background(), slog.New(slog.NewTextHandler(&logs, nil)), sysBlock, dev,
				Cmdline{RootWait: tt.wait}, etcd)
			if err != nil {
				t.Fatal(err)
			}
			if got.kind != tt.wantKind {
				t.Errorf("chose %s (%s), want %s", got.kind, got.why, tt.wantKind)
			}
			if el := time.Since(start); tt.late && el < 300*time.Millisecond || !tt.late && el < tt.wait {
				t.Errorf("chose after %s", el)
			}
			for _, w := range tt.wantLog {
				if w = strings.ReplaceAll(w, "DEV/", dev+"/"); !strings.Contains(logs.String(), w) {
					t.Errorf("the console does not say %s:\n%s", w, logs.String())
				}
			}
		})
	}
}
