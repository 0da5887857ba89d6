package output

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/kilnproject/kiln/internal/nodeimage"
)

// ISOSource is what the iso output is made of: the bake's root filesystem image (the file that
// went into root-a) and a boot image (disk.WriteBootImage) whose loader entry boots it live from
// the medium with ISOCmdline.
type ISOSource struct {
	RootFS, BootImage string // host paths
	// Disk, when set, is the raw disk image zstd-compressed (CompressDisk), put at
	// nodeimage.ISODiskPath for the boot image's install entry (ISOInstallCmdline).
	Disk string
	// Created is the time every date in the volume is set to (the bake's creation time,
	// SOURCE_DATE_EPOCH; the zero time means 1970-01-01), so the same files give the same ISO
	// bytes.
	Created time.Time
}

// ISOCmdline is the kernel command line of an ISO's live boot: the image's boot arguments
// (disk.BootArgs: no root=) and the root filesystem image on the medium with its sha256.
func ISOCmdline(kernelArgs, rootfsSHA256 string) string {
	return strings.TrimSpace(kernelArgs) + " kiln.live.rootfs_url=" + nodeimage.MediumScheme + nodeimage.ISORootFSPath +
		" kiln.live.rootfs_sha256=" + rootfsSHA256
}

// ISOInstallCmdline is the kernel command line of an installer ISO's install entry: the image's
// boot arguments and stage 1's install mode reading the compressed raw disk image from the
// medium (nodeimage.ISODiskPath, with its sha256) onto dev (auto, /dev/<disk> or a by-id
// name), over a disk holding data only with wipe. No kiln.config.url= is added: the installed
// node takes its config as a disk boot does.
func ISOInstallCmdline(kernelArgs, diskSHA256, dev string, wipe bool) string {
	s := strings.TrimSpace(kernelArgs) + " kiln.install.image_url=" + nodeimage.MediumScheme + nodeimage.ISODiskPath +
		" kiln.install.image_sha256=" + diskSHA256 + " kiln.install.dev=" + dev
	if wipe {
		s += " kiln.install.wipe=1"
	}
	return s
}

// CompressDisk writes the raw disk image raw zstd-compressed to dst, which must not exist, with
// the image's size in the frame header (stage 1's install checks the target disk's size
// against it before writing), and returns dst's sha256. On error dst does not exist.
func CompressDisk(ctx context.Context, raw, dst string) (sum string, err error) {
	in, err := os.Open(raw)
	if err != nil {
		return "", fmt.Errorf("compress disk: %w", err)
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return "", fmt.Errorf("compress disk: %w", err)
	}
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return "", fmt.Errorf("compress disk: %w", err)
	}
	defer func() {
		if err != nil {
			os.Remove(dst)
		}
	}()
	h := sha256.New()
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedDefault), zstd.WithEncoderConcurrency(runtime.GOMAXPROCS(0)))
	if err != nil {
		out.Close()
		return "", fmt.Errorf("compress disk: %w", err)
	}
	enc.ResetContentSize(io.MultiWriter(out, h), fi.Size())
	_, err = io.CopyBuffer(enc, ctxReader{ctx, in}, make([]byte, 4<<20))
	if cerr := enc.Close(); err == nil {
		err = cerr
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", fmt.Errorf("compress disk %s to %s: %w", raw, dst, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// ctxReader ends a read once its context is done.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// WriteISO writes dst, which must not exist, as a hybrid ISO 9660 image labelled
// nodeimage.ISOLabel that boots live under UEFI: from a CD (its El Torito EFI entry) or, written
// to a USB stick, from the EFI system partition of the GPT in its system area. Both are a FAT
// image (nodeimage.ISOBootImagePath, src.BootImage) holding systemd-boot, a loader entry with
// ISOCmdline, the kernel and the initramfs; the root filesystem image is
// nodeimage.ISORootFSPath.
//
// xorriso writes the volume: go-diskfs's ISO 9660 writer makes the El Torito catalog but no
// partition table in the system area, so its images boot from a CD only. The files are staged
// in dst+".partial.d" and the image is written to dst+".partial", renamed to dst at the end:
// on error neither remains and dst does not exist.
func WriteISO(ctx context.Context, dst string, src ISOSource) error {
	if err := checkISOSource(src); err != nil {
		return fmt.Errorf("iso %s: %w", filepath.Base(dst), err)
	}
	if _, err := os.Lstat(dst); err == nil {
		return fmt.Errorf("iso: %s exists already", dst)
	}
	if _, err := exec.LookPath("xorriso"); err != nil {
		return errors.New("iso: xorriso not found: install the Debian package xorriso")
	}
	stage, tmp := dst+".partial.d", dst+".partial"
	for _, p := range []string{stage, tmp} {
		if err := os.RemoveAll(p); err != nil {
			return fmt.Errorf("iso: remove stale %s: %w", p, err)
		}
	}
	defer os.RemoveAll(stage)
	err := writeISO(ctx, stage, tmp, src)
	if err == nil {
		err = os.Rename(tmp, dst)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("iso %s: %w", filepath.Base(dst), err)
	}
	return nil
}

// checkISOSource refuses a source with a missing, empty or irregular file, and a boot image
// that is no FAT volume.
func checkISOSource(src ISOSource) error {
	var problems []string
	files := []struct{ what, path string }{{"root filesystem image", src.RootFS}, {"boot image", src.BootImage}}
	if src.Disk != "" {
		files = append(files, struct{ what, path string }{"compressed disk image", src.Disk})
	}
	for _, f := range files {
		if f.path == "" {
			problems = append(problems, "no "+f.what+" file given")
			continue
		}
		fi, err := os.Stat(f.path)
		switch {
		case err != nil:
			problems = append(problems, fmt.Sprintf("%s: %v", f.what, err))
		case !fi.Mode().IsRegular():
			problems = append(problems, fmt.Sprintf("%s %s is not a regular file", f.what, f.path))
		case fi.Size() == 0:
			problems = append(problems, fmt.Sprintf("%s %s is empty", f.what, f.path))
		case f.what == "boot image" && !isFAT(f.path):
			problems = append(problems, fmt.Sprintf("boot image %s is not a FAT volume (no boot sector signature)", f.path))
		}
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "; "))
	}
	return nil
}

// isFAT reports whether the file p starts with a FAT boot sector: the 0x55AA signature and a
// FAT type string.
func isFAT(p string) bool {
	f, err := os.Open(p)
	if err != nil {
		return false
	}
	defer f.Close()
	b := make([]byte, 512)
	if _, err := io.ReadFull(f, b); err != nil {
		return false
	}
	return b[510] == 0x55 && b[511] == 0xaa && (string(b[82:87]) == "FAT32" || string(b[54:57]) == "FAT")
}

// writeISO stages the files in stage and runs xorriso to write the image to tmp.
func writeISO(ctx context.Context, stage, tmp string, src ISOSource) error {
	files := []struct{ src, dst string }{{src.RootFS, nodeimage.ISORootFSPath}, {src.BootImage, nodeimage.ISOBootImagePath}}
	if src.Disk != "" {
		files = append(files, struct{ src, dst string }{src.Disk, nodeimage.ISODiskPath})
	}
	for _, f := range files {
		p := filepath.Join(stage, filepath.FromSlash(f.dst))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := linkOrCopy(f.src, p); err != nil {
			return err
		}
	}
	// xorriso takes the volume's dates from SOURCE_DATE_EPOCH and each file's from its mtime
	// (not its ctime or atime): both are set to src.Created, so the bytes depend on the files
	// alone. The staged names are links to the bake's files, which get that mtime too.
	created := src.Created
	if created.Unix() < 0 { // the zero time: SOURCE_DATE_EPOCH takes no date before 1970
		created = time.Unix(0, 0)
	}
	if err := stampTree(stage, created); err != nil {
		return err
	}
	bootRel := strings.TrimPrefix(nodeimage.ISOBootImagePath, "/")
	// -e/-no-emul-boot: the El Torito entry for UEFI (platform 0xEF) loading the FAT image
	// (load size 0 above 32 MiB: UEFI then reads the FAT's own size); --efi-boot-part
	// --efi-boot-image with --protective-msdos-label: a GPT in the system area whose EFI system
	// partition is that same image, so the ISO written to a USB stick boots too. Rock Ridge (-R)
	// keeps the names as they are; -iso-level 3 lets a file exceed 4 GiB (multi-extent), as
	// a compressed disk image might.
	cmd := exec.CommandContext(ctx, "xorriso", "-as", "mkisofs",
		"-quiet", "-R", "-iso-level", "3", "-V", nodeimage.ISOLabel,
		"-o", tmp,
		"-e", bootRel, "-no-emul-boot",
		"--efi-boot-part", "--efi-boot-image", "--protective-msdos-label",
		stage)
	cmd.Env = append(slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "SOURCE_DATE_EPOCH=") }),
		"SOURCE_DATE_EPOCH="+strconv.FormatInt(created.Unix(), 10))
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s: %v: %s", strings.Join(cmd.Args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// AddISOConfig writes dst, which must not exist, as a copy of the ISO src (a WriteISO output)
// with config at nodeimage.ISOConfigPath, replacing one there already; first boot reads it from
// the medium (initd/source's iso-medium source). xorriso replays src's boot setup (the El
// Torito EFI entry and the hybrid GPT whose EFI system partition is the boot image), so dst
// boots as src does; every other file keeps its bytes. The image is written to dst+".partial"
// and renamed at the end: on error dst does not exist.
func AddISOConfig(ctx context.Context, src, dst string, config []byte) error {
	if len(config) == 0 {
		return fmt.Errorf("iso %s: the config is empty", filepath.Base(dst))
	}
	if id, err := nodeimage.ISOVolumeID(src); err != nil {
		return fmt.Errorf("iso %s: %w", src, err)
	} else if id != nodeimage.ISOLabel {
		return fmt.Errorf("iso %s: volume %q is not a kiln iso (%s)", src, id, nodeimage.ISOLabel)
	}
	if _, err := os.Lstat(dst); err == nil {
		return fmt.Errorf("iso: %s exists already", dst)
	}
	if _, err := exec.LookPath("xorriso"); err != nil {
		return errors.New("iso: xorriso not found: install the Debian package xorriso")
	}
	tmp := dst + ".partial"
	if err := os.RemoveAll(tmp); err != nil {
		return fmt.Errorf("iso: remove stale %s: %w", tmp, err)
	}
	cfg, err := os.CreateTemp(filepath.Dir(dst), ".config-*.ign")
	if err != nil {
		return fmt.Errorf("iso: %w", err)
	}
	defer os.Remove(cfg.Name())
	_, err = cfg.Write(config)
	if cerr := cfg.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("iso: %w", err)
	}
	cmd := exec.CommandContext(ctx, "xorriso", "-report_about", "SORRY", "-indev", src, "-outdev", tmp,
		"-boot_image", "any", "replay", "-map", cfg.Name(), nodeimage.ISOConfigPath, "-chmod", "0444", nodeimage.ISOConfigPath, "--", "-commit")
	out, err := cmd.CombinedOutput()
	if err == nil {
		err = os.Rename(tmp, dst)
	} else {
		err = fmt.Errorf("%s: %v: %s", strings.Join(cmd.Args, " "), err, strings.TrimSpace(string(out)))
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("iso %s: %w", filepath.Base(dst), err)
	}
	return nil
}

// stampTree sets the modification time of dir and everything below it to t, the deepest first.
func stampTree(dir string, t time.Time) error {
	var paths []string
	err := filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
		paths = append(paths, p)
		return err
	})
	if err != nil {
		return err
	}
	for _, p := range slices.Backward(paths) {
		if err := os.Chtimes(p, t, t); err != nil {
			return err
		}
	}
	return nil
}
