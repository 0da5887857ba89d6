package blockdev

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"strings"
)

// Filesystem signatures ProbeFilesystem reports.
const (
	FSNone    = ""        // the probed area is all zero: safe to format
	FSExt4    = "ext4"    // ext2/3/4 superblock magic 0xEF53 at byte 1080
	fsUnknown = "unknown" // non-zero data without a signature stage 1 knows
)

// probeSize is how much of the start of a device ProbeFilesystem reads. It covers the
// superblocks of the common filesystems (btrfs sits at 64 KiB) and partition tables.
const probeSize = 1 << 20

// ProbeFilesystem looks at the start of a device or image and names what is on it: FSExt4, FSNone
// when the first MiB (or the whole device if smaller) is zero, another filesystem or partition
// table name (squashfs, erofs, xfs, btrfs, vfat, swap, crypto_LUKS, gpt, dos) when it recognises
// the signature, or "unknown" for other non-zero data. Only FSNone may be formatted.
func ProbeFilesystem(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("probe filesystem: %w", err)
	}
	defer f.Close()
	buf := make([]byte, probeSize)
	n, err := f.ReadAt(buf, 0)
	if err != nil && err != io.EOF {
		return "", fmt.Errorf("probe filesystem on %s: %w", path, err)
	}
	return identify(buf[:n]), nil
}

// ProbeFilesystemAt is ProbeFilesystem for the filesystem starting off bytes into path (a partition
// read through its disk), with the volume label when it is ext4.
func ProbeFilesystemAt(path string, off int64) (fs, label string, err error) {
	f, err := os.Open(path)
	if err != nil {
		return "", "", fmt.Errorf("probe filesystem: %w", err)
	}
	defer f.Close()
	buf := make([]byte, probeSize)
	n, err := f.ReadAt(buf, off)
	if err != nil && err != io.EOF {
		return "", "", fmt.Errorf("probe filesystem on %s at byte %d: %w", path, off, err)
	}
	fs = identify(buf[:n])
	if fs == FSExt4 {
		label = ext4Label(buf[:n])
	}
	return fs, label, nil
}

// ext4Label is the volume name in an ext2/3/4 superblock (s_volume_name, 16 bytes at byte 120
// of the superblock, which starts at byte 1024).
func ext4Label(b []byte) string {
	const at = 1024 + 120
	if len(b) < at+16 {
		return ""
	}
	return string(bytes.TrimRight(b[at:at+16], "\x00"))
}

func identify(b []byte) string {
	at := func(off int, sig string) bool {
		return len(b) >= off+len(sig) && string(b[off:off+len(sig)]) == sig
	}
	le32 := func(off int) uint32 {
		if len(b) < off+4 {
			return 0
		}
		return binary.LittleEndian.Uint32(b[off:])
	}
	switch {
	case len(b) >= 1082 && binary.LittleEndian.Uint16(b[1080:]) == 0xEF53:
		return FSExt4
	case at(0, "hsqs"):
		return "squashfs"
	case le32(1024) == 0xE0F5E1E2:
		return "erofs"
	case at(0, "XFSB"):
		return "xfs"
	case at(0x10040, "_BHRfS_M"):
		return "btrfs"
	case at(0, "LUKS\xba\xbe"):
		return "crypto_LUKS"
	case le32(0) == mdMagic || le32(4096) == mdMagic:
		return "linux_raid_member"
	case lvmLabel(b):
		return "LVM2_member"
	case at(32769, "CD001"):
		return "iso9660"
	case at(4096-10, "SWAPSPACE2") || at(4096-10, "SWAP-SPACE"):
		return "swap"
	case at(512, "EFI PART") || at(4096, "EFI PART"):
		return "gpt"
	case at(510, "\x55\xaa") && (at(54, "FAT1") || at(82, "FAT32") || at(3, "MSDOS") || at(3, "mkfs.fat")):
		return "vfat"
	case at(510, "\x55\xaa"):
		return "dos"
	}
	if len(bytes.Trim(b, "\x00")) == 0 {
		return FSNone
	}
	return fsUnknown
}

// mdMagic is the Linux software RAID superblock magic, little-endian in versions 1.x.
const mdMagic = 0xa92b4efc

// lvmLabel reports whether an LVM physical volume label ("LABELONE" … "LVM2 001") is in one of
// the first four sectors of b.
func lvmLabel(b []byte) bool {
	for s := 0; s < 4; s++ {
		off := s * 512
		if len(b) >= off+32 && string(b[off:off+8]) == "LABELONE" && string(b[off+24:off+32]) == "LVM2 001" {
			return true
		}
	}
	return false
}

// ProbeDisk names everything on a whole disk that says it holds data: what ProbeFilesystem
// finds in the first MiB (a partition table, a filesystem, a RAID member, LUKS, LVM, or
// "unknown" for other non-zero bytes), and the signatures kept at the end of a disk: a backup
// GPT header ("gpt (backup header at the end)") and a RAID superblock of version 0.90 or 1.0
// ("linux_raid_member (superblock at the end)"). An empty result is a disk holding nothing
// stage 1 knows of: the installer writes only to such a disk unless told to wipe.
func ProbeDisk(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("probe disk: %w", err)
	}
	defer f.Close()
	size, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return nil, fmt.Errorf("probe disk %s: size: %w", path, err)
	}
	head, err := readSpan(f, 0, min(size, probeSize))
	if err != nil {
		return nil, fmt.Errorf("probe disk %s: %w", path, err)
	}
	var found []string
	if fs := identify(head); fs != FSNone {
		found = append(found, fs)
	}
	tailOff := max(0, size-probeSize)
	tail, err := readSpan(f, tailOff, size-tailOff)
	if err != nil {
		return nil, fmt.Errorf("probe disk %s: %w", path, err)
	}
	return append(found, identifyTail(tail, tailOff, size)...), nil
}

func readSpan(f io.ReaderAt, off, n int64) ([]byte, error) {
	b := make([]byte, n)
	if _, err := f.ReadAt(b, off); err != nil && err != io.EOF {
		return nil, err
	}
	return b, nil
}

// identifyTail looks for the signatures kept at the end of a disk of size bytes in b, which
// holds the disk's bytes from off to the end.
func identifyTail(b []byte, off, size int64) []string {
	at := func(abs int64, n int) []byte {
		if abs < off || abs+int64(n) > off+int64(len(b)) {
			return nil
		}
		return b[abs-off : abs-off+int64(n)]
	}
	var found []string
	if string(at(size-512, 8)) == "EFI PART" || string(at(size-4096, 8)) == "EFI PART" {
		found = append(found, "gpt (backup header at the end)")
	}
	md090 := at(size&^0xffff-0x10000, 4) // version 0.90: 64 KiB from the 64 KiB-aligned end
	md10 := at((size-8192)&^0xfff, 4)    // version 1.0: 8 KiB from the end, 4 KiB aligned
	for _, m := range [][]byte{md090, md10} {
		if len(m) == 4 && (binary.LittleEndian.Uint32(m) == mdMagic || binary.BigEndian.Uint32(m) == mdMagic) {
			found = append(found, "linux_raid_member (superblock at the end)")
			break
		}
	}
	return found
}

// IsBlank reports whether the disk at path holds nothing: ProbeDisk finds no signature at
// either end, and its last MiB is all zero too (so a disk with data ProbeDisk cannot
// name is not taken for an empty one). Otherwise it says what it found.
func IsBlank(path string) (bool, string, error) {
	found, err := ProbeDisk(path)
	if err != nil {
		return false, "", err
	}
	if len(found) > 0 {
		return false, strings.Join(found, ", "), nil
	}
	f, err := os.Open(path)
	if err != nil {
		return false, "", err
	}
	defer f.Close()
	end, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return false, "", err
	}
	buf := make([]byte, min(end, probeSize))
	if _, err := f.ReadAt(buf, end-int64(len(buf))); err != nil && err != io.EOF {
		return false, "", err
	}
	if len(bytes.Trim(buf, "\x00")) != 0 {
		return false, "data in its last MiB", nil
	}
	return true, "", nil
}
