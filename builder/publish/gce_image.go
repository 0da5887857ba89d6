package publish

import (
	"archive/tar"
	"compress/gzip"
	"crypto/md5"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/kilnproject/kiln/builder/output"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

// gceImage is a gce-format output to publish, as the bake recorded it in <stem>.json beside it.
type gceImage struct {
	file   string
	size   int64
	sha256 string // hex: the image's identity
	meta   *nodeimage.Metadata
}

// gceSums are the checksums of a file read once: the SHA-256 kiln checks, and the CRC32C and
// MD5 Cloud Storage checks the upload against.
type gceSums struct {
	sha256 string
	crc32c uint32
	md5    []byte
}

var gceHexDigest = regexp.MustCompile(`^[0-9a-f]{64}$`)

// loadGCEImage reads the metadata beside file (a gce output, <stem>.tar.gz, and <stem>.json)
// and checks that file is the output it lists: the gce format, of the recorded size, a tarball
// whose first entry is disk.raw. It does not hash the file (see sumFile).
func loadGCEImage(file string) (*gceImage, error) {
	format, err := output.Lookup("gce")
	if err != nil {
		return nil, err
	}
	base := filepath.Base(file)
	if !strings.HasSuffix(base, format.Suffix) {
		if f := output.OfFile(base); f != "" {
			return nil, fmt.Errorf("%s: a %s output; GCE takes the gce format (<image>-<role>%s)", file, f, format.Suffix)
		}
		return nil, fmt.Errorf("%s: not a gce output (<image>-<role>%s)", file, format.Suffix)
	}
	sidecar := filepath.Join(filepath.Dir(file), strings.TrimSuffix(base, format.Suffix)+".json")
	data, err := os.ReadFile(sidecar)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%s: no metadata beside it (%s): publish takes a bake's output directory as written", file, sidecar)
	}
	if err != nil {
		return nil, err
	}
	md := new(nodeimage.Metadata)
	if err := json.Unmarshal(data, md); err != nil {
		return nil, fmt.Errorf("%s: %w", sidecar, err)
	}
	var out *nodeimage.OutputInfo
	for i := range md.Outputs {
		if md.Outputs[i].File == base {
			out = &md.Outputs[i]
		}
	}
	switch {
	case out == nil:
		return nil, fmt.Errorf("%s: %s is not among its outputs", sidecar, base)
	case out.Format != format.Name:
		return nil, fmt.Errorf("%s: %s has format %q, want %q", sidecar, base, out.Format, format.Name)
	case !gceHexDigest.MatchString(out.SHA256):
		return nil, fmt.Errorf("%s: %s has no sha256 (bake it again with this kiln)", sidecar, base)
	}
	fi, err := os.Stat(file)
	if err != nil {
		return nil, err
	}
	if fi.Size() != out.Size {
		return nil, fmt.Errorf("%s: %d bytes, %s says %d: not the file the bake wrote", file, fi.Size(), sidecar, out.Size)
	}
	if err := checkDiskRawTar(file); err != nil {
		return nil, err
	}
	return &gceImage{file: file, size: out.Size, sha256: out.SHA256, meta: md}, nil
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
