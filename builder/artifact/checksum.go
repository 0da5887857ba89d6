package artifact

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path"
	"strings"
	"time"

	"github.com/kilnproject/kiln/internal/fetch"
)

// The checksums publishers put beside their release files: dl.k8s.io's <file>.sha256 (the hex
// digest alone), the <file>.sha256sum of containerd and the CNI plugins, sha256sum's own
// format ("<hex>  <name>" lines, a '*' before the name in binary mode) in files such as
// SHA256SUMS that list a whole release. kiln lock checks a first download against the
// publisher's checksum where there is one, so that a pin is not only what one download
// happened to get.

// checksumSuffixes are the names tried beside an artifact's URL, in order.
var checksumSuffixes = []string{".sha256", ".sha256sum"}

// maxChecksumFile caps what is read of a checksum file (a SHA256SUMS of a large release is
// some kilobytes).
const maxChecksumFile = 1 << 20

// checksumTimeout bounds the fetch of one checksum file.
const checksumTimeout = 2 * time.Minute

// PinnedByDownload is LockedArtifact.PinnedFrom for a pin that no publisher's checksum
// confirmed: the sha256 of the first download.
const PinnedByDownload = "download"

// errNoChecksum says that the server has no checksum file at the URL asked: 404 or 410, or
// 401 or 403, which object stores answer for a name they do not have.
var errNoChecksum = errors.New("no checksum file there")

// ChecksumMismatchError is a download that the publisher's checksum file contradicts.
type ChecksumMismatchError struct {
	URL, ChecksumURL string
	Publisher, Got   string
}

func (e *ChecksumMismatchError) Error() string {
	return fmt.Sprintf("%s hashes to sha256 %s but the publisher's %s says %s: not pinned (a damaged or replaced download, or a checksum of another file)",
		e.URL, e.Got, e.ChecksumURL, e.Publisher)
}

// checkPublisherSum checks sum, the sha256 of the artifact downloaded from fileURL, against the
// publisher's checksum: at checksumURL when the profile names one (it must exist and list the
// file), else beside the file (fileURL + checksumSuffixes, the first that exists). It returns
// the URL of the checksum file that confirmed sum, or PinnedByDownload when none is beside the
// file.
func (c *Cache) checkPublisherSum(ctx context.Context, fileURL, checksumURL, sum string) (string, error) {
	candidates := []string{checksumURL}
	if checksumURL == "" {
		candidates = nil
		for _, s := range checksumSuffixes {
			candidates = append(candidates, fileURL+s)
		}
	}
	for _, u := range candidates {
		var data []byte
		err := c.retry(ctx, u, nil, func(ctx context.Context) error {
			var err error
			data, err = c.getChecksumFile(ctx, u)
			return err
		})
		if errors.Is(err, errNoChecksum) && checksumURL == "" {
			continue
		}
		if err != nil {
			return "", fmt.Errorf("publisher's checksum %s: %w", u, err)
		}
		want, err := checksumFor(data, path.Base(fileURL))
		if err != nil {
			return "", fmt.Errorf("publisher's checksum %s: %w", u, err)
		}
		if want != sum {
			return "", &ChecksumMismatchError{URL: fileURL, ChecksumURL: u, Publisher: want, Got: sum}
		}
		return u, nil
	}
	return PinnedByDownload, nil
}

// getChecksumFile makes one attempt at fetching a checksum file, following only safe
// redirects (fetch.Do). Its errors are marked as the artifact downloads' are for c.retry: a
// missing file (errNoChecksum) and answers that will not change are permanent; a 5xx, a 429
// and a broken connection are tried again.
func (c *Cache) getChecksumFile(ctx context.Context, u string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, checksumTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, fetch.Permanent(err)
	}
	req.Header.Set("User-Agent", "kiln")
	resp, err := fetch.Do(c.Client, req)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", u, fetch.Cause(ctx, err))
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusNotFound, http.StatusGone, http.StatusUnauthorized, http.StatusForbidden:
		return nil, fetch.Permanent(fmt.Errorf("%w (%s)", errNoChecksum, resp.Status))
	}
	if err := fetch.CheckStatus(resp, c.Retry.now()); err != nil {
		return nil, fmt.Errorf("server answered: %w", err)
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxChecksumFile+1))
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", u, fetch.Cause(ctx, err))
	}
	if len(data) > maxChecksumFile {
		return nil, fetch.Permanent(fmt.Errorf("more than %d bytes: not a checksum file", maxChecksumFile))
	}
	return data, nil
}

// checksumFor finds the sha256 of the file called name in a checksum file: the one digest of
// a file that holds only a digest (dl.k8s.io's), else the digest on the line naming name
// (sha256sum's "<hex>  <name>" or "<hex> *<name>", the name possibly with a directory).
func checksumFor(data []byte, name string) (string, error) {
	type line struct {
		n      int
		fields []string
	}
	var lines []line
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		f := strings.Fields(sc.Text())
		if len(f) == 0 || strings.HasPrefix(f[0], "#") {
			continue
		}
		lines = append(lines, line{n, f})
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	if len(lines) == 1 && len(lines[0].fields) == 1 {
		d := strings.ToLower(lines[0].fields[0])
		if !hexRE.MatchString(d) {
			return "", fmt.Errorf("line %d: %q is not a sha256 (64 hex digits)", lines[0].n, lines[0].fields[0])
		}
		return d, nil
	}
	for _, l := range lines {
		if len(l.fields) != 2 {
			continue
		}
		listed := strings.TrimPrefix(l.fields[1], "*")
		if listed != name && path.Base(listed) != name {
			continue
		}
		d := strings.ToLower(l.fields[0])
		if !hexRE.MatchString(d) {
			return "", fmt.Errorf("line %d: %q is not a sha256 (64 hex digits)", l.n, l.fields[0])
		}
		return d, nil
	}
	return "", fmt.Errorf("lists no sha256 for %s", name)
}
