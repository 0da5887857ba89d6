// Package bounded caps what is read from a stream: past the cap a read fails with an error
// the caller chooses, instead of the data being cut short without a word.
package bounded

import "io"

// Reader passes through the first limit bytes of a stream. When the stream holds more, Read
// fails with the caller's error, and keeps failing; a stream of exactly limit bytes ends as
// usual. Reader never passes on more than limit bytes.
type Reader struct {
	r    io.Reader
	left int64
	over error
	hit  bool
}

// NewReader bounds r at limit bytes (a negative limit counts as 0); reading past them
// fails with over.
func NewReader(r io.Reader, limit int64, over error) *Reader {
	return &Reader{r: r, left: max(limit, 0), over: over}
}

func (b *Reader) Read(p []byte) (int, error) {
	if b.hit {
		return 0, b.over
	}
	if b.left == 0 {
		if len(p) == 0 {
			return 0, nil
		}
		// At the cap: one more byte means the stream is too large.
		var one [1]byte
		n, err := b.r.Read(one[:])
		if n > 0 {
			b.hit = true
			return 0, b.over
		}
		return 0, err
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.r.Read(p)
	b.left -= int64(n)
	return n, err
}

// ReadAll reads r to its end and returns what it held, or fails with over once r turns
// out to hold more than limit bytes. Errors from r are returned as they are.
func ReadAll(r io.Reader, limit int64, over error) ([]byte, error) {
	return io.ReadAll(NewReader(r, limit, over))
}
