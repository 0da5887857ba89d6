package output

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/kilnproject/kiln/internal/nodeimage"
)

// ISOSource is what the iso output is made of: the bake's root filesystem image (the file that
// went into root-a) and a boot image (disk.WriteBootImage) whose loader entry boots it live from
// the medium with ISOCmdline.
type ISOSource struct {
	RootFS, BootImage string // host paths
}

// ISOCmdline is the kernel command line of an ISO's live boot: the image's boot arguments
// (disk.BootArgs: no root=) and the root filesystem image on the medium with its sha256.
func ISOCmdline(kernelArgs, rootfsSHA256 string) string {
	return strings.TrimSpace(kernelArgs) + " kiln.live.rootfs_url=" + nodeimage.MediumScheme + nodeimage.ISORootFSPath +
		" kiln.live.rootfs_sha256=" + rootfsSHA256
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
	for _, f := range []struct{ what, path string }{{"root filesystem image", src.RootFS}, {"boot image", src.BootImage}} {
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
	for _, f := range []struct{ src, dst string }{{src.RootFS, nodeimage.ISORootFSPath}, {src.BootImage, nodeimage.ISOBootImagePath}} {
		p := filepath.Join(stage, filepath.FromSlash(f.dst))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := linkOrCopy(f.src, p); err != nil {
			return err
		}
	}
	bootRel := strings.TrimPrefix(nodeimage.ISOBootImagePath, "/")
	// -e/-no-emul-boot: the El Torito entry for UEFI (platform 0xEF) loading the FAT image
	// (load size 0 above 32 MiB: UEFI then reads the FAT's own size); --efi-boot-part
	// --efi-boot-image with --protective-msdos-label: a GPT in the system area whose EFI system
	// partition is that same image, so the ISO written to a USB stick boots too. Rock Ridge (-R)
	// keeps the names as they are; SOURCE_DATE_EPOCH, when set, makes xorriso's output
	// reproducible.
	cmd := exec.CommandContext(ctx, "xorriso", "-as", "mkisofs",
		"-quiet", "-R", "-V", nodeimage.ISOLabel,
		"-o", tmp,
		"-e", bootRel, "-no-emul-boot",
		"--efi-boot-part", "--efi-boot-image", "--protective-msdos-label",
		stage)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s: %v: %s", strings.Join(cmd.Args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}
