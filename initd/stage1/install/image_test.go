package install

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	diskfs "github.com/diskfs/go-diskfs"
	"github.com/diskfs/go-diskfs/disk"
	"github.com/diskfs/go-diskfs/filesystem"
	"github.com/diskfs/go-diskfs/partition/gpt"

	"github.com/kilnproject/kiln/initd/blockdev"
	"github.com/kilnproject/kiln/internal/nodeimage"
	"github.com/kilnproject/kiln/internal/testkit"
)

const mib = 1 << 20

// Layout of the test image: a kiln disk in small (a 40 MiB ESP, 4 MiB root slots).
const (
	imageSize   = 56 * mib
	espStart    = 1 * mib
	espSize     = 40 * mib
	rootAStart  = espStart + espSize
	rootSize    = 4 * mib
	rootBStart  = rootAStart + rootSize
	rootAGUID   = "8a4cb5a3-0f41-4a8e-9b0c-3a1f7d2e6c55"
	testOptions = "root=PARTUUID=" + rootAGUID + " rootfstype=squashfs ro kiln.platform=metal console=ttyS0"
)

// testImage is a raw kiln disk image made with go-diskfs: GPT, FAT32 ESP holding the loader
// entry, root-a full of random bytes (the "root filesystem"), root-b empty.
type testImage struct {
	path  string
	raw   []byte
	rootA []byte
}

func makeImage(t *testing.T) testImage {
	t.Helper()
	p := filepath.Join(t.TempDir(), "metal-worker.raw")
	d, err := diskfs.Create(p, imageSize, 512)
	if err != nil {
		t.Fatal(err)
	}
	table := &gpt.Table{LogicalSectorSize: 512, PhysicalSectorSize: 512, ProtectiveMBR: true, Partitions: []*gpt.Partition{
		{Index: 1, Start: espStart / 512, End: (espStart+espSize)/512 - 1, Type: gpt.EFISystemPartition, Name: nodeimage.ESPName},
		{Index: 2, Start: rootAStart / 512, End: (rootAStart+rootSize)/512 - 1, Type: gpt.Type(strings.ToUpper(nodeimage.TypeRootX86)), Name: nodeimage.RootAName, GUID: strings.ToUpper(rootAGUID)},
		{Index: 3, Start: rootBStart / 512, End: (rootBStart+rootSize)/512 - 1, Type: gpt.Type(strings.ToUpper(nodeimage.TypeRootX86)), Name: nodeimage.RootBName},
	}}
	if err := d.Partition(table); err != nil {
		t.Fatal(err)
	}
	fs, err := d.CreateFilesystem(disk.FilesystemSpec{Partition: 1, FSType: filesystem.TypeFat32, VolumeLabel: nodeimage.ESPLabel})
	if err != nil {
		t.Fatal(err)
	}
	if err := fs.Mkdir(nodeimage.LoaderEntriesDir); err != nil {
		t.Fatal(err)
	}
	w, err := fs.OpenFile(nodeimage.LoaderEntryPath, os.O_CREATE|os.O_RDWR|os.O_TRUNC)
	if err != nil {
		t.Fatal(err)
	}
	entry := "title kiln\nlinux " + nodeimage.KernelPath + "\ninitrd " + nodeimage.InitrdPath + "\noptions " + testOptions + "\n"
	if _, err := io.WriteString(w, entry); err != nil {
		t.Fatal(err)
	}
	w.Close()
	fs.Close()
	rootA := make([]byte, rootSize)
	rand.Read(rootA)
	if _, err := d.WritePartitionContents(2, bytes.NewReader(rootA)); err != nil {
		t.Fatal(err)
	}
	d.Close()
	raw, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return testImage{path: p, raw: raw, rootA: rootA}
}

// sparseDisk returns a sparse file of size bytes, a disk for the installer.
func sparseDisk(t *testing.T, size int64) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "disk")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	return p
}

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func fileSHA(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return sha(b)
}

// loaderOptions reads the options line of the boot entry on the disk's ESP.
func loaderOptions(t *testing.T, p string) string {
	t.Helper()
	d, err := diskfs.Open(p, diskfs.WithOpenMode(diskfs.ReadOnly))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	fs, err := d.GetFilesystem(1)
	if err != nil {
		t.Fatalf("ESP of %s: %v", p, err)
	}
	f, err := fs.OpenFile(nodeimage.LoaderEntryPath, os.O_RDONLY)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(f)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if o, ok := strings.CutPrefix(l, "options "); ok {
			return o
		}
	}
	t.Fatalf("no options line in %q", b)
	return ""
}

// assertInstalled checks that disk p boots img: a valid GPT (as stage 1 reads it) with the
// image's partitions, root-a's bytes, and the boot entry's options wantOptions.
func assertInstalled(t *testing.T, p string, img testImage, wantOptions string) {
	t.Helper()
	parts, err := blockdev.ReadGPT(p, 512)
	if err != nil {
		t.Fatalf("installed disk: %v", err)
	}
	if len(parts) != 3 || parts[1].GUID != rootAGUID || parts[0].Type != nodeimage.TypeESP {
		t.Fatalf("installed disk's partitions = %+v", parts)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	got := make([]byte, rootSize)
	if _, err := f.ReadAt(got, rootAStart); err != nil || !bytes.Equal(got, img.rootA) {
		t.Errorf("root-a on the installed disk differs from the image's (%v)", err)
	}
	if o := loaderOptions(t, p); o != wantOptions {
		t.Errorf("boot entry options = %q, want %q", o, wantOptions)
	}
}

// assertUnbootable checks that disk p has no GPT a firmware or stage 1 could use: neither the
// primary nor the backup (at the disk's end) is valid, and no signature is left at either.
func assertUnbootable(t *testing.T, p string) {
	t.Helper()
	if parts, err := blockdev.ReadGPT(p, 512); err == nil {
		t.Errorf("disk has a valid GPT after a failed install: %+v", parts)
	}
	holds, err := blockdev.ProbeDisk(p)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range holds {
		if strings.HasPrefix(h, "gpt") || h == "dos" {
			t.Errorf("disk still holds %q after a failed install", h)
		}
	}
}

// fsckESP runs fsck.fat -n on the ESP of the disk image p and returns what it says, with the
// file's name taken out.
func fsckESP(t *testing.T, p string) string {
	t.Helper()
	b := make([]byte, espSize)
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.ReadAt(b, espStart); err != nil {
		t.Fatal(err)
	}
	esp := filepath.Join(t.TempDir(), "esp.img")
	if err := os.WriteFile(esp, b, 0o600); err != nil {
		t.Fatal(err)
	}
	out, _ := exec.Command(testkit.Tool(t, "fsck.fat", "dosfstools"), "-n", "-V", esp).CombinedOutput()
	return strings.ReplaceAll(string(out), esp, "ESP")
}

// assertESPClean checks that editing the boot entry left the FAT filesystem of disk p's ESP
// as sound as the image's own: fsck.fat finds no more to repair than on the image (go-diskfs
// leaves a few things it would tidy).
func assertESPClean(t *testing.T, p string, img testImage) {
	t.Helper()
	if got, want := fsckESP(t, p), fsckESP(t, img.path); got != want {
		t.Errorf("fsck.fat on the installed ESP says\n%s\non the image's\n%s", got, want)
	}
}
