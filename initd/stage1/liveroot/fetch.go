// Package liveroot fetches the root image of a live boot into RAM and attaches it to a loop
// device. The image is streamed over HTTP(S) into a file on the initramfs' own tmpfs or ramfs,
// hashed as it arrives and compared with the sha256 from the kernel command line before
// anything uses it: an image that differs by one byte is deleted and never attached. A network
// error, a stalled or cut-short body and a 5xx answer are tried again with backoff, resuming
// where the file ends when the server allows it (Range with If-Range on the answer's ETag or
// Last-Modified; the sha256 then covers the bytes already there and the rest); a 4xx answer,
// an image larger than the free memory and a wrong sha256 stop at once. FetchMedium copies the
// image from the boot medium instead (the iso output: the ISO 9660 volume FindMedium finds by its
// label), into the same file and checked the same way.
package liveroot

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/kilnproject/kiln/internal/fetch"
	"github.com/kilnproject/kiln/internal/poll"
)

// Defaults for Fetcher's zero fields.
const (
	defaultAttempts = 6
	defaultReserve  = 256 << 20
	defaultStall    = 30 * time.Second
	defaultProgress = 5 * time.Second
	// fileName is the image's name in Fetcher.Dir.
	fileName = "rootfs.img"
)

// defaultBackoff paces the attempts: 1 s, 2 s, 4 s, 8 s, then 15 s.
var defaultBackoff = poll.Backoff{Initial: time.Second, Factor: 2, Max: 15 * time.Second, Jitter: 0.2}

// Fetcher fetches a root image into RAM. Only Dir is required.
type Fetcher struct {
	// Dir is where the image is written; it must be on a tmpfs or ramfs.
	Dir string
	// httpClient makes the requests; nil means one with connection and header timeouts.
	// Redirects from https to http are refused either way.
	httpClient *http.Client
	// attempts bounds how often the image is requested; 0 means defaultAttempts.
	attempts int
	// backoff paces the attempts; the zero value means defaultBackoff.
	backoff poll.Backoff
	// clock times the pauses between attempts; nil means the wall clock.
	clock poll.Clock
	// reserve is the memory the image must leave free for the running system; 0 means
	// defaultReserve.
	reserve int64
	// stall ends an attempt whose body sends nothing for this long; 0 means 30 s.
	stall time.Duration
	// memInfo is the meminfo file read for MemAvailable; empty means /proc/meminfo.
	memInfo string
}

// Fetch streams url into Dir/rootfs.img and checks it has the sha256 want (lowercase hex). It
// returns the file's path; on any error the file is gone.
func (f Fetcher) Fetch(ctx context.Context, log *slog.Logger, url, want string) (string, error) {
	if err := os.MkdirAll(f.Dir, 0o700); err != nil {
		return "", fmt.Errorf("live root: %w", err)
	}
	room, err := f.room()
	if err != nil {
		return "", fmt.Errorf("live root: %w", err)
	}
	path := filepath.Join(f.Dir, fileName)
	attempts := cmp.Or(f.attempts, defaultAttempts)
	backoff := f.backoff
	if backoff == (poll.Backoff{}) {
		backoff = defaultBackoff
	}
	sum, part := "", &partial{}
	retry := fetch.Retry{
		Attempts: attempts,
		Backoff:  backoff,
		Clock:    f.clock,
		OnRetry: func(a poll.Attempt) {
			log.Warn("live root: fetch failed, trying again", "url", url, "attempt", a.N, "of", attempts, "in", a.Pause.Round(time.Millisecond), "err", a.Err)
		},
	}
	err = retry.Do(ctx, "the live root image "+url, func(ctx context.Context) error {
		var err error
		sum, err = f.fetchOnce(ctx, log, url, path, room, part)
		return err
	})
	if err != nil {
		os.Remove(path)
		return "", fmt.Errorf("live root %s: %w", url, err)
	}
	if sum != want {
		os.Remove(path)
		return "", fmt.Errorf("live root %s: sha256 mismatch: the image has %s, kiln.live.rootfs_sha256 wants %s: refusing to use it", url, sum, want)
	}
	if err := os.Chmod(path, 0o400); err != nil {
		os.Remove(path)
		return "", fmt.Errorf("live root: %w", err)
	}
	return path, nil
}

// partial is what the attempts so far left in the file, for the next one to resume.
type partial struct {
	have int64 // bytes in the file
	// validator is the strong ETag or the Last-Modified of the answer the bytes came from,
	// sent as If-Range; empty when the server gave neither, and the next attempt starts over.
	validator string
}

// fetchOnce makes one request, streams the answer into path (after the bytes part says an
// earlier attempt left, when the server resumes) and returns the whole file's sha256.
func (f Fetcher) fetchOnce(ctx context.Context, log *slog.Logger, url, path string, room int64, part *partial) (string, error) {
	ctx, watch := fetch.Watch(ctx, cmp.Or(f.stall, defaultStall))
	defer watch.Stop()
	resp, err := f.request(ctx, url, part)
	if err != nil {
		return "", fetch.Cause(ctx, err)
	}
	defer resp.Body.Close()
	start, err := resumeAt(resp, part)
	if err != nil {
		return "", err
	}
	if start+resp.ContentLength > room {
		return "", fetch.Permanent(fmt.Errorf("the image is %s, more than the %s of RAM free for it (%s kept for the system)",
			size(start+resp.ContentLength), size(room), size(cmp.Or(f.reserve, defaultReserve))))
	}
	out, h, err := openAt(path, start)
	if err != nil {
		return "", err
	}
	body := watch.Reader(resp.Body)
	p := &progress{log: log, total: -1, done: start, every: defaultProgress, last: time.Now()}
	if resp.ContentLength >= 0 {
		p.total = start + resp.ContentLength
	}
	err = copyLimited(io.MultiWriter(fileWriter{out, room}, h, p), body, room-start)
	part.have = p.done
	if cerr := out.Close(); err == nil && cerr != nil {
		err = fetch.Permanent(fmt.Errorf("write %s: %w", path, cerr))
	}
	if err != nil {
		return "", fetch.Cause(ctx, err)
	}
	log.Info("live root fetched", "url", url, "bytes", p.done, "resumed_at", start)
	return hex.EncodeToString(h.Sum(nil)), nil
}

// request sends the GET, asking for the rest of the image when part can be resumed.
func (f Fetcher) request(ctx context.Context, url string, part *partial) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fetch.Permanent(err)
	}
	if part.have > 0 && part.validator != "" {
		req.Header.Set("Range", fmt.Sprintf("bytes=%d-", part.have))
		req.Header.Set("If-Range", part.validator)
	}
	return fetch.Do(f.client(), req)
}

// resumeAt checks the answer and returns the offset its body starts at: part.have for a 206
// that resumes where the file ends, 0 for a 200 (the image anew; part then records the
// answer's validator).
func resumeAt(resp *http.Response, part *partial) (int64, error) {
	if resp.StatusCode == http.StatusPartialContent {
		first, err := fetch.ContentRangeStart(resp.Header.Get("Content-Range"))
		if err != nil || first != part.have {
			asked := part.have
			*part = partial{} // the next attempt starts over
			return 0, fmt.Errorf("server answered bytes %q to a request for bytes %d-", resp.Header.Get("Content-Range"), asked)
		}
		return first, nil
	}
	if err := fetch.CheckStatus(resp, time.Now()); err != nil {
		return 0, err
	}
	*part = partial{validator: fetch.Validator(resp.Header)}
	return 0, nil
}

// openAt opens path for writing at off, dropping what lies past it, and returns a hash that
// has already read the bytes before off.
func openAt(path string, off int64) (*os.File, hash.Hash, error) {
	out, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, nil, fetch.Permanent(fmt.Errorf("create %s: %w", path, err))
	}
	h := sha256.New()
	err = out.Truncate(off)
	if err == nil {
		_, err = io.Copy(h, io.NewSectionReader(out, 0, off))
	}
	if err == nil {
		_, err = out.Seek(off, io.SeekStart)
	}
	if err != nil {
		out.Close()
		return nil, nil, fetch.Permanent(fmt.Errorf("resume %s at byte %d: %w", path, off, err))
	}
	return out, h, nil
}

// copyLimited copies r to w and fails, without writing past it, when r holds more than limit
// bytes.
func copyLimited(w io.Writer, r io.Reader, limit int64) error {
	n, err := io.Copy(w, io.LimitReader(r, limit+1))
	if err != nil {
		return err
	}
	if n > limit {
		return fetch.Permanent(fmt.Errorf("the image is larger than the %s of RAM free for it", size(limit)))
	}
	return nil
}

// fileWriter writes to the image file; its errors are the machine's, not the network's, and
// another attempt would not help.
type fileWriter struct {
	f    *os.File
	room int64
}

func (w fileWriter) Write(b []byte) (int, error) {
	n, err := w.f.Write(b)
	switch {
	case errors.Is(err, syscall.ENOSPC):
		return n, fetch.Permanent(fmt.Errorf("the image is larger than the %s of RAM free for it (%w)", size(w.room), err))
	case err != nil:
		return n, fetch.Permanent(err)
	}
	return n, nil
}

func (f Fetcher) client() *http.Client {
	if f.httpClient != nil {
		return f.httpClient
	}
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.ResponseHeaderTimeout = 30 * time.Second
	return &http.Client{Transport: t}
}

// size renders a byte count for the console.
func size(n int64) string {
	const mib = 1 << 20
	if n < 10*mib {
		return strconv.FormatInt(n, 10) + " bytes"
	}
	return strconv.FormatInt(n/mib, 10) + " MiB"
}
