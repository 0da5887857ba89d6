package update

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/kilnproject/kiln/internal/bounded"
	"github.com/kilnproject/kiln/internal/fetch"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

// Source is where an update's files come from: a bake's <image>-<role>.json and the files of
// its pxe directory (kernel, initramfs, root image), from an http(s) URL or a local path.
type Source interface {
	// Metadata reads <image>-<role>.json.
	Metadata(ctx context.Context) (*nodeimage.Metadata, error)
	// Open opens a file of the pxe directory (name as PXEInfo records it).
	Open(ctx context.Context, name string) (io.ReadCloser, error)
	// String names the source in messages.
	String() string
}

// maxMetadata bounds <image>-<role>.json.
const maxMetadata = 4 << 20

// NewSource returns the source from names: an http or https URL of <image>-<role>.json, or its
// path on the node.
func NewSource(from string, hc *http.Client) (Source, error) {
	if strings.HasPrefix(from, "http://") || strings.HasPrefix(from, "https://") {
		u, err := url.Parse(from)
		if err != nil || u.Host == "" {
			return nil, fmt.Errorf("--from %s: not a URL with a host", from)
		}
		return &urlSource{u: u, hc: fetch.SafeRedirects(hc)}, nil
	}
	if strings.Contains(from, "://") {
		return nil, fmt.Errorf("--from %s: scheme not supported (want http, https or a file path)", from)
	}
	if !strings.HasSuffix(from, ".json") {
		return nil, fmt.Errorf("--from %s: want the bake's <image>-<role>.json (the pxe directory beside it)", from)
	}
	return fileSource(from), nil
}

func decodeMetadata(r io.Reader, what string) (*nodeimage.Metadata, error) {
	var md nodeimage.Metadata
	b, err := bounded.ReadAll(r, maxMetadata, fmt.Errorf("%s is over %d bytes: not an image's metadata", what, maxMetadata))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", what, err)
	}
	if err := json.Unmarshal(b, &md); err != nil {
		return nil, fmt.Errorf("%s: not an image's metadata: %w", what, err)
	}
	return &md, nil
}

type fileSource string

func (f fileSource) String() string { return string(f) }

func (f fileSource) Metadata(context.Context) (*nodeimage.Metadata, error) {
	r, err := os.Open(string(f))
	if err != nil {
		return nil, err
	}
	defer r.Close()
	return decodeMetadata(r, string(f))
}

func (f fileSource) Open(_ context.Context, name string) (io.ReadCloser, error) {
	return os.Open(filepath.Join(filepath.Dir(string(f)), filepath.FromSlash(name)))
}

type urlSource struct {
	u  *url.URL
	hc *http.Client
}

func (s *urlSource) String() string { return s.u.String() }

// stallAfter ends a download whose server sends nothing for this long.
const stallAfter = 60 * time.Second

func (s *urlSource) get(ctx context.Context, u *url.URL) (io.ReadCloser, error) {
	var body io.ReadCloser
	err := fetch.Retry{Attempts: 5}.Do(ctx, "GET "+u.String(), func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
		if err != nil {
			return fetch.Permanent(err)
		}
		resp, err := fetch.Do(s.hc, req)
		if err != nil {
			return err
		}
		if err := fetch.CheckStatus(resp, time.Now()); err != nil {
			resp.Body.Close()
			return fmt.Errorf("GET %s: %w", u, err)
		}
		body = resp.Body
		return nil
	})
	return body, err
}

func (s *urlSource) Metadata(ctx context.Context) (*nodeimage.Metadata, error) {
	body, err := s.get(ctx, s.u)
	if err != nil {
		return nil, err
	}
	defer body.Close()
	return decodeMetadata(body, s.u.String())
}

// Open fetches a file of the pxe directory; a body that stalls for stallAfter ends the read.
func (s *urlSource) Open(ctx context.Context, name string) (io.ReadCloser, error) {
	ref := *s.u
	ref.Path = path.Join(path.Dir(s.u.Path), name)
	ref.RawQuery = ""
	wctx, w := fetch.Watch(ctx, stallAfter)
	body, err := s.get(wctx, &ref)
	if err != nil {
		w.Stop()
		return nil, fetch.Cause(wctx, err)
	}
	return &watchedBody{Reader: w.Reader(body), body: body, w: w, ctx: wctx}, nil
}

type watchedBody struct {
	io.Reader
	body io.Closer
	w    *fetch.Watchdog
	ctx  context.Context
}

func (b *watchedBody) Read(p []byte) (int, error) {
	n, err := b.Reader.Read(p)
	if err != nil && err != io.EOF {
		err = fetch.Cause(b.ctx, err)
	}
	return n, err
}

func (b *watchedBody) Close() error {
	b.w.Stop()
	return b.body.Close()
}
