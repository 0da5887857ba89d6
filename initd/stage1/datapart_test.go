package stage1

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	diskfs "github.com/diskfs/go-diskfs"
	"github.com/diskfs/go-diskfs/partition/gpt"

	"github.com/kilnproject/kiln/internal/nodeimage"
	"github.com/kilnproject/kiln/internal/testkit"
)

const (
	mib         = int64(1 << 20)
	rootAGUID   = "6b1c7a36-1f4e-4d0a-9a55-0c3b1e2f4a5b"
	imageSize   = 256 * mib
	imageLastMB = 1 + 32 + 64 + 64 // ESP + root-a + root-b end at this MiB
)

// makeImage writes a sparse GPT image laid out like the builder's (ESP, root-a, root-b, 1 MiB
// aligned) with go-diskfs and returns its path.
func makeImage(t *testing.T, size int64) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "disk.img")
	d, err := diskfs.Create(path, size, diskfs.SectorSize512)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	sect := func(m int64) uint64 { return uint64(m * mib / 512) }
	table := &gpt.Table{
		LogicalSectorSize:  512,
		PhysicalSectorSize: 512,
		ProtectiveMBR:      true,
		Partitions: []*gpt.Partition{
			{Index: 1, Start: sect(1), End: sect(33) - 1, Type: gpt.EFISystemPartition, Name: "ESP"},
			{Index: 2, Start: sect(33), End: sect(97) - 1, Type: gpt.LinuxRootX86_64, Name: "root-a", GUID: rootAGUID},
			{Index: 3, Start: sect(97), End: sect(imageLastMB) - 1, Type: gpt.LinuxRootX86_64, Name: "root-b"},
		},
	}
	if err := d.Partition(table); err != nil {
		t.Fatal(err)
	}
	return path
}

func sgdisk(t *testing.T, args ...string) string {
	t.Helper()
	return testkit.Run(t, "sgdisk", args...)
}

// dataPartCase is a built image and the disk size stage 1 finds it on.
type dataPartCase struct {
	name     string
	imgSize  int64
	diskSize int64 // truncate the image to this before stage 1 sees it
}

var dataPartCases = []dataPartCase{
	{name: "disk as built", imgSize: imageSize, diskSize: imageSize},
	{name: "disk grown with truncate", imgSize: imageSize, diskSize: 3 << 30},
	{name: "disk grown past 2 TiB", imgSize: imageSize, diskSize: 3 << 40},
}

func TestEnsureDataPartition(t *testing.T) {
	testkit.Tool(t, "sgdisk", "gdisk")
	for _, tt := range dataPartCases {
		t.Run(tt.name, func(t *testing.T) {
			img := makeImage(t, tt.imgSize)
			if err := os.Truncate(img, tt.diskSize); err != nil {
				t.Fatal(err)
			}
			p, created, err := ensureDataPartition(img, 512)
			if err != nil {
				t.Fatal(err)
			}
			if !created {
				t.Fatal("created = false on a disk without data partition")
			}
			lastSector := uint64(tt.diskSize/512) - 1
			wantStart := uint64(imageLastMB * mib / 512)
			wantEnd := (lastSector-33+1)/2048*2048 - 1
			if p.Index != 4 || p.Name != "data" || p.Start != wantStart || p.End != wantEnd ||
				p.Type != nodeimage.TypeLinuxData {
				t.Errorf("data partition = %+v, want #4 \"data\" type %s sectors %d-%d", p, nodeimage.TypeLinuxData, wantStart, wantEnd)
			}
			checkSgdisk(t, img, wantStart, wantEnd)
			checkGPTHeaders(t, tt, img, lastSector)

			// Second run: nothing changes.
			before := hashHeaders(t, img)
			p2, created2, err := ensureDataPartition(img, 512)
			if err != nil {
				t.Fatal(err)
			}
			if created2 || p2 != p {
				t.Errorf("second run: created=%v partition %+v, want unchanged %+v", created2, p2, p)
			}
			if hashHeaders(t, img) != before {
				t.Error("second run rewrote the partition table")
			}
		})
	}
}

// checkSgdisk checks that sgdisk finds nothing wrong with img (backup header at the real end, CRCs
// good), sees the data partition at wantStart-wantEnd and kept the image's own partitions.
func checkSgdisk(t *testing.T, img string, wantStart, wantEnd uint64) {
	t.Helper()
	v := sgdisk(t, "-v", img)
	if !strings.Contains(v, "No problems found") || strings.Contains(v, "Caution") || strings.Contains(v, "Warning") {
		t.Errorf("sgdisk -v:\n%s", v)
	}
	pr := sgdisk(t, "-p", img)
	if !regexp.MustCompile(`(?m)^\s+4\s+` + strconv.FormatUint(wantStart, 10) + `\s+` +
		strconv.FormatUint(wantEnd, 10) + `\s+.*8300\s+data$`).MatchString(pr) {
		t.Errorf("sgdisk -p does not show partition 4 data %d-%d type 8300:\n%s", wantStart, wantEnd, pr)
	}
	for _, name := range []string{"ESP", "root-a", "root-b"} {
		if !strings.Contains(pr, name) {
			t.Errorf("sgdisk -p lost partition %s:\n%s", name, pr)
		}
	}
	info := sgdisk(t, "-i", "2", img)
	if !strings.Contains(info, strings.ToUpper(rootAGUID)) {
		t.Errorf("root-a lost its PARTUUID %s:\n%s", rootAGUID, info)
	}
}

// checkGPTHeaders checks the backup header sits at lastSector, a moved one's old copy is cleared
// and the protective MBR covers the disk.
func checkGPTHeaders(t *testing.T, tt dataPartCase, img string, lastSector uint64) {
	t.Helper()
	f, err := os.Open(img)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	hdr := make([]byte, 512)
	if _, err := f.ReadAt(hdr, int64(lastSector)*512); err != nil || string(hdr[:8]) != "EFI PART" {
		t.Errorf("no backup GPT header at the last sector %d (%v)", lastSector, err)
	}
	if tt.diskSize != tt.imgSize {
		oldLast := tt.imgSize/512 - 1
		if _, err := f.ReadAt(hdr, oldLast*512); err != nil || bytes.Contains(hdr, []byte("EFI PART")) {
			t.Errorf("stale backup GPT header left at old last sector %d (%v)", oldLast, err)
		}
	}
	mbr := make([]byte, 16)
	if _, err := f.ReadAt(mbr, 446); err != nil {
		t.Fatal(err)
	}
	wantMBR := uint32(min(lastSector, 0xFFFFFFFF))
	if mbr[4] != 0xee || binary.LittleEndian.Uint32(mbr[12:]) != wantMBR {
		t.Errorf("protective MBR type %#x size %d, want 0xee size %d", mbr[4], binary.LittleEndian.Uint32(mbr[12:]), wantMBR)
	}
}

// hashHeaders returns the first 34 and last 33 sectors.
func hashHeaders(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fi, _ := f.Stat()
	head := make([]byte, 34*512)
	tail := make([]byte, 33*512)
	if _, err := f.ReadAt(head, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := f.ReadAt(tail, fi.Size()-int64(len(tail))); err != nil {
		t.Fatal(err)
	}
	return string(head) + string(tail)
}

func TestEnsureDataPartitionNoRoom(t *testing.T) {
	// The image ends 16 MiB after root-b: too small for the data partition.
	img := makeImage(t, (imageLastMB+16)*mib)
	before := hashHeaders(t, img)
	_, _, err := ensureDataPartition(img, 512)
	if err == nil || !strings.Contains(err.Error(), "bytes free after the last partition") {
		t.Fatalf("error = %v, want a 'not enough free space' error", err)
	}
	if hashHeaders(t, img) != before {
		t.Error("the partition table changed although no partition was added")
	}
}

func TestEnsureDataPartitionNotGPT(t *testing.T) {
	img := filepath.Join(t.TempDir(), "blank.img")
	if err := os.WriteFile(img, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, imageSize); err != nil {
		t.Fatal(err)
	}
	_, _, err := ensureDataPartition(img, 512)
	if err == nil || !strings.Contains(err.Error(), "read GPT of "+img) {
		t.Fatalf("error = %v, want it to name the GPT of %s", err, img)
	}
}
