package artifact

import (
	"archive/tar"
	"fmt"
	"io"

	"github.com/kilnproject/kiln/internal/bounded"
)

// MaxUnpacked bounds what one base image layer or one artifact archive may unpack to: 16 GiB of
// decompressed stream, and separately 16 GiB of file contents (a sparse file counts its holes).
// A node's whole root is a few GiB; past the bound the input is a decompression bomb, and
// unpacking stops with an error naming the layer or artifact instead of filling the disk.
const MaxUnpacked int64 = 16 << 30

// TooBigError says that a layer or archive unpacks past its bound.
type TooBigError struct {
	Max  int64
	What string // "stream" or "file contents"
}

func (e *TooBigError) Error() string {
	return fmt.Sprintf("unpacks to more than %s of %s (the bound on one layer or archive): refusing a decompression bomb", size(e.Max), e.What)
}

func size(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%d GiB", n>>30)
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprintf("%d bytes", n)
}

// Unpacked counts what a decompressor yields and what the tar entries read from it hold, and
// fails once either passes its bound.
type Unpacked struct {
	r    *bounded.Reader
	max  int64
	file int64
}

// LimitUnpacked wraps the decompressed stream r of one layer or archive; max <= 0 means
// MaxUnpacked.
func LimitUnpacked(r io.Reader, max int64) *Unpacked {
	if max <= 0 {
		max = MaxUnpacked
	}
	return &Unpacked{r: bounded.NewReader(r, max, &TooBigError{Max: max, What: "stream"}), max: max}
}

func (u *Unpacked) Read(p []byte) (int, error) { return u.r.Read(p) }

// AddFile charges the content of a tar entry (its logical size, holes included) to the bound.
func (u *Unpacked) AddFile(h *tar.Header) error {
	if h.Typeflag != tar.TypeReg && h.Typeflag != tar.TypeRegA && h.Typeflag != tar.TypeGNUSparse {
		return nil
	}
	if h.Size < 0 || h.Size > u.max-u.file {
		return &TooBigError{Max: u.max, What: "file contents"}
	}
	u.file += h.Size
	return nil
}
