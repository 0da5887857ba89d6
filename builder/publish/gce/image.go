package gce

import (
	"archive/tar"
	"compress/gzip"
	"crypto/md5"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash/crc32"
	"io"
	"os"

	"github.com/kilnproject/kiln/builder/output"
	"github.com/kilnproject/kiln/builder/publish"
)

// gceSums are the checksums of a file read once: the SHA-256 kiln checks, and the CRC32C and
// MD5 Cloud Storage checks the upload against.
type gceSums struct {
	sha256 string
	crc32c uint32
	md5    []byte
}

// Load loads the gce output file (see publish.Load) and checks that it is a tarball whose
// first entry is disk.raw, as GCE requires. It does not hash the file: Publish does.
func Load(file string) (*publish.Image, error) {
	format, err := output.Lookup("gce")
	if err != nil {
		return nil, err
	}
	if f := output.OfFile(file); f != format.Name {
		if f != "" {
			return nil, fmt.Errorf("%s: a %s output; GCE takes the gce format (<image>-<role>%s)", file, f, format.Suffix)
		}
		return nil, fmt.Errorf("%s: not a gce output (<image>-<role>%s)", file, format.Suffix)
	}
	im, err := publish.Load(file)
	if err != nil {
		return nil, err
	}
	if im.Format() != format.Name {
		return nil, fmt.Errorf("%s: its metadata gives the format %q, want %q", file, im.Format(), format.Name)
	}
	if err := checkDiskRawTar(file); err != nil {
		return nil, err
	}
	return im, nil
}

// checkDiskRawTar checks that file is a gzip'd tar whose first entry is disk.raw, as GCE
// requires.
func checkDiskRawTar(file string) error {
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		return fmt.Errorf("%s: not a gce image (gzip): %w", file, err)
	}
	h, err := tar.NewReader(zr).Next()
	if err != nil {
		return fmt.Errorf("%s: not a gce image (tar): %w", file, err)
	}
	if h.Name != "disk.raw" {
		return fmt.Errorf("%s: not a gce image: first entry %q, want disk.raw", file, h.Name)
	}
	return nil
}

// sumFile reads file once and returns its checksums.
func sumFile(file string) (gceSums, error) {
	f, err := os.Open(file)
	if err != nil {
		return gceSums{}, err
	}
	defer f.Close()
	s, c, m := sha256.New(), crc32.New(crc32.MakeTable(crc32.Castagnoli)), md5.New()
	if _, err := io.Copy(io.MultiWriter(s, c, m), f); err != nil {
		return gceSums{}, fmt.Errorf("read %s: %w", file, err)
	}
	return gceSums{sha256: hex.EncodeToString(s.Sum(nil)), crc32c: c.Sum32(), md5: m.Sum(nil)}, nil
}
