package output

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// zeros is what a hole of a sparse file reads as, fed to the hash without reading the file.
var zeros = make([]byte, 1<<20)

// HashFile is the hex SHA-256 and the size of the file p: what the image metadata records
// for each output. A sparse file's holes are hashed as the zeros they read as, without
// reading them: a raw disk of 4 GiB holds a few hundred MiB of data, and right after the
// bake wrote it (its pages still dirty) reading the rest through the page cache took four
// times as long as hashing it.
func HashFile(p string) (string, int64, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", 0, err
	}
	h := sha256.New()
	if err := hashSparse(h, f, fi.Size()); err != nil {
		return "", 0, fmt.Errorf("hash %s: %w", p, err)
	}
	return hex.EncodeToString(h.Sum(nil)), fi.Size(), nil
}

// hashSparse writes the size bytes of f to h: its data extents as read, its holes (found
// with SEEK_DATA and SEEK_HOLE) as zeros. A file system without SEEK_DATA is read whole.
func hashSparse(h hash.Hash, f *os.File, size int64) error {
	fd := int(f.Fd())
	for off := int64(0); off < size; {
		data, err := unix.Seek(fd, off, unix.SEEK_DATA)
		switch {
		case errors.Is(err, unix.ENXIO): // no data after off: a hole to the end
			data = size
		case errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP):
			_, err := io.Copy(h, io.NewSectionReader(f, off, size-off))
			return err
		case err != nil:
			return fmt.Errorf("seek data at %d: %w", off, err)
		}
		data = min(data, size)
		if err := writeZeros(h, data-off); err != nil {
			return err
		}
		if data == size {
			return nil
		}
		hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("seek hole at %d: %w", data, err)
		}
		hole = min(hole, size)
		if n, err := io.Copy(h, io.NewSectionReader(f, data, hole-data)); err != nil {
			return err
		} else if n != hole-data {
			return fmt.Errorf("read %d bytes at %d, want %d: the file shrank", n, data, hole-data)
		}
		off = hole
	}
	return nil
}

// writeZeros writes n zero bytes to w.
func writeZeros(w io.Writer, n int64) error {
	for n > 0 {
		k := min(n, int64(len(zeros)))
		if _, err := w.Write(zeros[:k]); err != nil {
			return err
		}
		n -= k
	}
	return nil
}
