package install

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"time"

	"github.com/diskfs/go-diskfs/backend"
)

// Held parts of the image: headSize bytes at its start (protective MBR, primary GPT, and in a
// kiln image nothing else: the ESP starts at 1 MiB) and at least its last tailSize bytes (the
// backup GPT). Neither reaches the disk before the whole image is verified.
const (
	headSize = 1 << 20
	tailSize = 1 << 20
)

// errTooLarge is returned (wrapped) when the image does not fit the disk.
var errTooLarge = errors.New("the image is larger than the disk")

// staging takes the decompressed image as a stream and writes it to the target, except for
// its head and tail (the last one to two MiB), which it holds until commit. Only one image passes through a staging.
type staging struct {
	f     *os.File
	limit int64 // the target's size
	n     int64 // image bytes received
	head  []byte
	// lag holds the most recent bytes received after the head that are not written yet:
	// image bytes n-len(lag) up to n. Once the stream ends they are the tail.
	lag []byte

	log     *slog.Logger
	every   time.Duration
	start   time.Time
	lastLog time.Time
}

func newStaging(f *os.File, limit int64, log *slog.Logger, every time.Duration) *staging {
	now := time.Now()
	return &staging{f: f, limit: limit, head: make([]byte, 0, headSize), lag: make([]byte, 0, 2*tailSize+64<<10),
		log: log, every: every, start: now, lastLog: now}
}

func (s *staging) Write(p []byte) (int, error) {
	if s.n+int64(len(p)) > s.limit {
		return 0, fmt.Errorf("%w (%d MiB): more than %d MiB arrived", errTooLarge, s.limit>>20, s.limit>>20)
	}
	total := len(p)
	if k := min(headSize-len(s.head), len(p)); k > 0 {
		s.head = append(s.head, p[:k]...)
		p = p[k:]
	}
	s.n += int64(total - len(p))
	for len(p) > 0 {
		k := min(len(p), cap(s.lag)-len(s.lag))
		s.lag = append(s.lag, p[:k]...)
		s.n += int64(k)
		p = p[k:]
		if err := s.flush(); err != nil {
			return total - len(p), err
		}
	}
	return total, s.report()
}

// flush writes out what lag holds beyond the last tailSize bytes, once that is at least
// tailSize, so that the copy costs no more than the write.
func (s *staging) flush() error {
	over := len(s.lag) - tailSize
	if over < tailSize {
		return nil
	}
	off := s.n - int64(len(s.lag))
	if _, err := s.f.WriteAt(s.lag[:over], off); err != nil {
		return fmt.Errorf("write at %d MiB: %w", off>>20, err)
	}
	s.lag = s.lag[:copy(s.lag, s.lag[over:])]
	return nil
}

// report logs the progress every s.every, after syncing, so the rate is the disk's.
func (s *staging) report() error {
	now := time.Now()
	if now.Sub(s.lastLog) < s.every {
		return nil
	}
	if err := s.f.Sync(); err != nil {
		return fmt.Errorf("sync: %w", err)
	}
	s.lastLog = now
	el := now.Sub(s.start).Seconds()
	s.log.Info("install: progress", "MiB", s.n>>20, "MiB/s", fmt.Sprintf("%.1f", float64(s.n)/(1<<20)/max(el, 1e-3)))
	return nil
}

// view returns the target as it will read after commit, up to the image's end, for reading
// the image's GPT and editing its ESP before anything is committed.
func (s *staging) view() *view {
	return &view{f: s.f, size: s.n, head: s.head, tail: s.lag, tailOff: s.n - int64(len(s.lag))}
}

// commit writes the tail, then the head, syncing after each: until the head is on the disk,
// the disk has no valid primary GPT, and until the tail is, no valid backup GPT at the
// image's end.
func (s *staging) commit() error {
	v := s.view()
	for _, part := range []struct {
		what string
		b    []byte
		off  int64
	}{{"image's last MiB (backup GPT)", v.tail, v.tailOff}, {"image's first MiB (GPT)", v.head, 0}} {
		if _, err := s.f.WriteAt(part.b, part.off); err != nil {
			return fmt.Errorf("write the %s: %w", part.what, err)
		}
		if err := s.f.Sync(); err != nil {
			return fmt.Errorf("sync the %s: %w", part.what, err)
		}
	}
	return nil
}

// view is a staged image: the held head and tail in memory, the rest on the target. It is
// the go-diskfs backend through which the installer reads the image's GPT and edits its ESP
// before commit; writes to the held parts stay in memory.
type view struct {
	f       *os.File
	size    int64
	head    []byte
	tail    []byte
	tailOff int64
	pos     int64
}

var _ backend.Storage = (*view)(nil)

func (v *view) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 || off >= v.size {
		return 0, io.EOF
	}
	var eof error
	if int64(len(p)) > v.size-off {
		p, eof = p[:v.size-off], io.EOF
	}
	if mid := v.middle(off, len(p)); mid.n > 0 {
		if _, err := v.f.ReadAt(p[mid.at:mid.at+mid.n], off+int64(mid.at)); err != nil && err != io.EOF {
			return 0, err
		}
	}
	for _, h := range v.held() {
		if lo, hi, ok := overlap(off, len(p), h.off, len(h.b)); ok {
			copy(p[lo-off:hi-off], h.b[lo-h.off:hi-h.off])
		}
	}
	return len(p), eof
}

func (v *view) WriteAt(p []byte, off int64) (int, error) {
	if off < 0 || off+int64(len(p)) > v.size {
		return 0, fmt.Errorf("write of %d bytes at %d: beyond the image's %d bytes", len(p), off, v.size)
	}
	if mid := v.middle(off, len(p)); mid.n > 0 {
		if _, err := v.f.WriteAt(p[mid.at:mid.at+mid.n], off+int64(mid.at)); err != nil {
			return 0, err
		}
	}
	for _, h := range v.held() {
		if lo, hi, ok := overlap(off, len(p), h.off, len(h.b)); ok {
			copy(h.b[lo-h.off:hi-h.off], p[lo-off:hi-off])
		}
	}
	return len(p), nil
}

type heldPart struct {
	b   []byte
	off int64
}

func (v *view) held() []heldPart { return []heldPart{{v.head, 0}, {v.tail, v.tailOff}} }

// middle is the part of [off, off+n) that lies on the target: between head and tail.
func (v *view) middle(off int64, n int) struct{ at, n int } {
	lo, hi, ok := overlap(off, n, int64(len(v.head)), int(v.tailOff-int64(len(v.head))))
	if !ok {
		return struct{ at, n int }{}
	}
	return struct{ at, n int }{int(lo - off), int(hi - lo)}
}

// overlap is the intersection of [a, a+an) and [b, b+bn).
func overlap(a int64, an int, b int64, bn int) (lo, hi int64, ok bool) {
	lo, hi = max(a, b), min(a+int64(an), b+int64(bn))
	return lo, hi, lo < hi
}

func (v *view) Seek(offset int64, whence int) (int64, error) {
	switch whence {
	case io.SeekStart:
		v.pos = offset
	case io.SeekCurrent:
		v.pos += offset
	case io.SeekEnd:
		v.pos = v.size + offset
	}
	return v.pos, nil
}

func (v *view) Read(p []byte) (int, error) {
	n, err := v.ReadAt(p, v.pos)
	v.pos += int64(n)
	return n, err
}

func (v *view) Stat() (fs.FileInfo, error) { return v.f.Stat() }
func (v *view) Close() error               { return nil }
func (v *view) Sys() (*os.File, error) {
	return nil, errors.New("a staged image has no file for ioctls")
}
func (v *view) Writable() (backend.WritableFile, error) { return v, nil }
func (v *view) Path() string                            { return "" }
