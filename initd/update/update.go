// Package update moves an installed node to a new image in place, A/B: it writes the slot the
// node did not boot from (root image with its dm-verity tree, kernel and initramfs on the ESP)
// and adds a boot entry for it with systemd-boot's boot counting, so that a new image which
// does not come up is given up after its tries and the old slot boots again by itself.
//
// The running slot is never written. The order of the writes is what makes a power cut at any
// point harmless: the inactive slot's old entry goes first (from then on nothing boots that
// slot), then the root image, kernel and initramfs are written and read back against their
// sha256 and the root's verity tree, and only then is the new entry, on trial, renamed into
// place. Bless marks a slot on trial good; Read tells the slots, the entries and a rollback
// apart; Rollback makes the other slot the default again.
package update

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kilnproject/kiln/internal/atomicfile"
	"github.com/kilnproject/kiln/internal/cmdline"
	"github.com/kilnproject/kiln/internal/nodeimage"
	"github.com/kilnproject/kiln/internal/verity"
)

// Options tune an update.
type Options struct {
	// AllowDowngrade takes an image created before the running one.
	AllowDowngrade bool
	// Tries is how many boots the new slot gets (DefaultTries when 0).
	Tries int
	// Now stamps the update's record; time.Now when nil.
	Now func() time.Time
}

// Running is what the node runs: its image's metadata (the root's image.json) and the root
// hash it booted with.
type Running struct {
	Image    *nodeimage.Metadata
	RootHash string
}

// ReadRunning reads the running image's metadata under root and the booted root hash from the
// kernel command line at cmdlinePath.
func ReadRunning(root, cmdlinePath string) (Running, error) {
	b, err := os.ReadFile(filepath.Join(root, nodeimage.ImageJSONPath))
	if err != nil {
		return Running{}, fmt.Errorf("the running image's metadata: %w", err)
	}
	var md nodeimage.Metadata
	if err := json.Unmarshal(b, &md); err != nil {
		return Running{}, fmt.Errorf("%s: %w", nodeimage.ImageJSONPath, err)
	}
	line, err := cmdline.Read(cmdlinePath)
	if err != nil {
		return Running{}, err
	}
	hash, _ := line.Lookup("kiln." + nodeimage.VerityRootHashKey)
	return Running{Image: &md, RootHash: hash}, nil
}

// ErrUpToDate is returned when the node already runs the image.
var ErrUpToDate = errors.New("the node already runs this image")

// Check refuses, before anything is written, an image the node cannot take: another role or
// platform, a contract this kiln-init does not know, one without a verity tree or pxe files,
// an older image (unless AllowDowngrade), one too big for the slot, the image already
// running (ErrUpToDate).
func Check(md *nodeimage.Metadata, run Running, slot Slot, o Options) error {
	what := fmt.Sprintf("image %s-%s", md.Name, md.Role)
	switch {
	case md.Contract != nodeimage.ContractVersion:
		return fmt.Errorf("%s follows bake↔boot contract %d; this kiln-init knows contract %d: update kiln-init first, or bake the image with a kiln of this node's contract",
			what, md.Contract, nodeimage.ContractVersion)
	case md.Role != run.Image.Role:
		return fmt.Errorf("%s is a %s image; this node is a %s", what, md.Role, run.Image.Role)
	case md.Platform != run.Image.Platform:
		return fmt.Errorf("%s is for platform %s; this node runs %s", what, md.Platform, run.Image.Platform)
	case md.PXE == nil:
		return fmt.Errorf("%s was baked without the pxe format: an update takes its kernel, initramfs and root image from the pxe directory (add pxe to the definition's formats)", what)
	case md.Verity == nil || md.Disk == nil:
		return fmt.Errorf("%s has no verity tree or disk layout in its metadata: bake it with this kiln", what)
	case md.Verity.RootHash == run.RootHash:
		return fmt.Errorf("%s (root hash %s): %w", what, md.Verity.RootHash, ErrUpToDate)
	case md.Created.Before(run.Image.Created) && !o.AllowDowngrade:
		return fmt.Errorf("%s was created %s, before the running image (%s): refusing a downgrade without --allow-downgrade",
			what, md.Created.UTC().Format(time.RFC3339), run.Image.Created.UTC().Format(time.RFC3339))
	case md.PXE.RootFS.Size > slot.Size:
		return fmt.Errorf("%s: its root image is %d bytes; slot %s (%s) holds %d", what, md.PXE.RootFS.Size, slot.Name, slot.Device, slot.Size)
	case md.Verity.Size != md.PXE.RootFS.Size:
		return fmt.Errorf("%s: its verity tree ends at byte %d but the root image is %d bytes", what, md.Verity.Size, md.PXE.RootFS.Size)
	}
	if _, err := verity.ParseRootHash(md.Verity.RootHash); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// Result is what Apply did.
type Result struct {
	Slot       Slot
	Entry      string
	Generation int
	RootHash   string
	Wrote      int64
	Took       time.Duration
}

// Apply writes md's files from src to disk's inactive slot and its boot entry, on trial for
// o.Tries boots, and records the update under root (StatePath). Check must have passed.
func Apply(ctx context.Context, log *slog.Logger, src Source, md *nodeimage.Metadata, disk Disk, root string, o Options) (Result, error) {
	start := time.Now()
	now := o.Now
	if now == nil {
		now = time.Now
	}
	tries := o.Tries
	if tries <= 0 {
		tries = DefaultTries
	}
	slot := disk.Other()
	res := Result{Slot: slot, RootHash: md.Verity.RootHash}
	entries, err := readEntries(disk.ESPDir)
	if err != nil {
		return res, err
	}
	// The slot to write is the fallback while the booted one is on trial.
	for _, e := range entries {
		if e.Slot == disk.Booted && e.Counting {
			return res, fmt.Errorf("the booted slot %s is on trial (%s) and slot %s is what the node falls back to: wait until kiln-update-check.service finds it good, or roll back", disk.Booted, e.File, slot.Letter)
		}
	}
	// 1. Nothing may boot the slot while it is written.
	for _, e := range entries {
		if e.Slot != slot.Letter {
			continue
		}
		if err := os.Remove(filepath.Join(disk.ESPDir, nodeimage.LoaderEntriesDir, e.File)); err != nil {
			return res, fmt.Errorf("remove the old entry of slot %s: %w", slot.Letter, err)
		}
		log.Info("removed the slot's old boot entry", "slot", slot.Name, "entry", e.File)
	}
	if err := syncDir(disk.ESPDir); err != nil {
		return res, err
	}
	// 2. The root image, read back against its sha256 and its verity tree.
	n, err := writeRoot(ctx, log, src, md, slot)
	if err != nil {
		return res, err
	}
	res.Wrote = n
	log.Info("root image verified on the disk", "slot", slot.Name, "root_hash", md.Verity.RootHash)
	// 3. Kernel, initramfs and the image's metadata on the ESP.
	for _, f := range []struct {
		file nodeimage.PXEFile
		dst  string
	}{{md.PXE.Kernel, slotKernel(slot.Letter)}, {md.PXE.Initrd, slotInitrd(slot.Letter)}} {
		if err := writeESPFile(ctx, src, md.PXE.Dir+"/"+f.file.File, f.file, espPath(disk.ESPDir, f.dst)); err != nil {
			return res, err
		}
		res.Wrote += f.file.Size
	}
	mdJSON, err := json.MarshalIndent(md, "", "  ")
	if err != nil {
		return res, err
	}
	if err := atomicfile.Write(espPath(disk.ESPDir, slotImageJSON(slot.Letter)), append(mdJSON, '\n'), atomicfile.Options{Mode: 0o644, DirMode: 0o755}); err != nil {
		return res, err
	}
	log.Info("kernel and initramfs written", "dir", "/kiln/"+slot.Letter)
	// 4. The entry, on trial, and a loader.conf that boots the first good entry.
	gen := 1
	for _, e := range entries {
		gen = max(gen, e.Generation()+1)
	}
	res.Generation, res.Entry = gen, entryFile(slot.Letter, tries)
	title := fmt.Sprintf("kiln %s %s (%s) slot %s", md.Name, md.Role, md.Kernel.Version, slot.Letter)
	text := entryText(title, gen, slot.Letter, entryOptions(md.Disk.Cmdline, slot.PARTUUID))
	if err := atomicWrite(espPath(disk.ESPDir, nodeimage.LoaderConfPath), loaderConf); err != nil {
		return res, err
	}
	if err := atomicWrite(filepath.Join(disk.ESPDir, nodeimage.LoaderEntriesDir, res.Entry), text); err != nil {
		return res, err
	}
	if err := syncDir(disk.ESPDir); err != nil {
		return res, err
	}
	res.Took = time.Since(start)
	st := State{Slot: slot.Letter, From: disk.Booted, Image: md.Name + "-" + md.Role, Kiln: md.Kiln, Created: md.Created,
		RootHash: md.Verity.RootHash, Entry: res.Entry, Generation: gen, Written: now().UTC(), Source: src.String()}
	if err := st.write(root); err != nil {
		return res, err
	}
	return res, nil
}

// partuuidRE matches root=PARTUUID=<guid> on a command line.
var partuuidRE = regexp.MustCompile(`\broot=PARTUUID=\S+`)

// entryOptions is the new image's disk command line booting the slot's partition, with
// panic=10 so that a kernel that panics reboots (and the try counts) instead of hanging.
func entryOptions(cmdline, partuuid string) string {
	c := partuuidRE.ReplaceAllString(cmdline, "root=PARTUUID="+partuuid)
	if !strings.Contains(" "+c+" ", " panic=") {
		c += " panic=10"
	}
	return c
}

// writeRoot streams the root image onto the slot's partition (never mounted: it is opened
// exclusively), checks its sha256, drops the written pages and reads the partition back
// against the verity tree.
func writeRoot(ctx context.Context, log *slog.Logger, src Source, md *nodeimage.Metadata, slot Slot) (int64, error) {
	t := time.Now()
	want := md.PXE.RootFS
	r, err := src.Open(ctx, md.PXE.Dir+"/"+want.File)
	if err != nil {
		return 0, fmt.Errorf("open the root image: %w", err)
	}
	defer r.Close()
	dev, err := os.OpenFile(slot.Device, os.O_WRONLY|unix.O_EXCL, 0)
	if err != nil {
		return 0, fmt.Errorf("open slot %s (%s) for writing: %w", slot.Name, slot.Device, err)
	}
	defer dev.Close()
	log.Info("writing the root image", "slot", slot.Name, "device", slot.Device, "bytes", want.Size)
	n, err := copyChecked(dev, r, "the root image", slot.Device, want)
	if err != nil {
		return n, err
	}
	if err := dev.Sync(); err != nil {
		return n, fmt.Errorf("sync %s: %w", slot.Device, err)
	}
	log.Info("root image written", "slot", slot.Name, "bytes", n, "took", time.Since(t).Round(time.Millisecond))
	return n, checkSlot(slot, md.Verity)
}

// checkSlot reads the slot back from the disk, not the page cache, and checks every block
// against the verity tree and the root hash the metadata records.
func checkSlot(slot Slot, v *nodeimage.VerityInfo) error {
	f, err := os.Open(slot.Device)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		return fmt.Errorf("drop the cached pages of %s: %w", slot.Device, err)
	}
	p, err := verity.Verify(f, v.HashOffset, v.RootHash)
	if p.DataBlocks != 0 && (p.DataBlocks != v.DataBlocks || hex.EncodeToString(p.Salt) != v.Salt) {
		return fmt.Errorf("slot %s after writing: its verity superblock (%d blocks, salt %x) is not the metadata's (%d, %s)", slot.Name, p.DataBlocks, p.Salt, v.DataBlocks, v.Salt)
	}
	if err != nil {
		return fmt.Errorf("slot %s (%s) read back: %w", slot.Name, slot.Device, err)
	}
	return nil
}

// writeESPFile writes a file of the pxe directory to dst on the ESP through a temporary name,
// checked against its sha256 before the rename.
func writeESPFile(ctx context.Context, src Source, name string, want nodeimage.PXEFile, dst string) (err error) {
	r, err := src.Open(ctx, name)
	if err != nil {
		return fmt.Errorf("open %s: %w", want.File, err)
	}
	defer r.Close()
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	tmp := dst + ".new"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if _, err := copyChecked(f, r, want.File, dst, want); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, dst)
}

// copyChecked copies what (a file of the pxe directory) from src to dst (named to in errors),
// at most one byte past its recorded size, and refuses it unless its size and sha256 are the
// metadata's.
func copyChecked(dst io.Writer, src io.Reader, what, to string, want nodeimage.PXEFile) (int64, error) {
	h := sha256.New()
	n, err := io.CopyBuffer(dst, io.TeeReader(io.LimitReader(src, want.Size+1), h), make([]byte, 1<<20))
	if err != nil {
		return n, fmt.Errorf("write %s to %s: %w", what, to, err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); n != want.Size || got != want.SHA256 {
		return n, fmt.Errorf("%s: %d bytes with sha256 %s; the metadata says %d bytes, sha256 %s: refusing it", what, n, got, want.Size, want.SHA256)
	}
	return n, nil
}
