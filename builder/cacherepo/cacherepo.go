// Package cacherepo keeps kiln's build cache entries in an OCI repository that CI runners
// share (kiln bake --cache-repo): a flattened base, the applied layers of a pre-pulled image,
// an artifact's laid files, a compressed initramfs. Each entry is an OCI artifact tagged
// <kind>-<key> (the key names the entry's inputs, a chain ID or a sha256): a config naming
// kind, key and the sha256 of the entry's stream, and one layer, that stream compressed with
// zstd. A pulled entry is used only once its blobs matched their digests and sizes and the
// stream its sha256; the caller then checks what it holds.
//
// The repository is a help, never a need: a registry that cannot be reached is reported once
// and left alone for the rest of the process, one that refuses a push (credentials that may
// only pull) is reported once and only pulled from, and an entry that fails a check is
// reported and made locally instead.
package cacherepo

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"regexp"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/klauspost/compress/zstd"
)

// Media types of a cache entry.
const (
	ArtifactType    = "application/vnd.kiln.cache.v1"
	ConfigMediaType = "application/vnd.kiln.cache.config.v1+json"
	LayerMediaType  = "application/vnd.kiln.cache.entry.v1+zstd"
)

// maxConfig bounds an entry's config blob: it holds three short strings.
const maxConfig = 64 << 10

// entryConfig is an entry's config blob.
type entryConfig struct {
	Kind string `json:"kind"`
	Key  string `json:"key"`
	// StreamSHA256 is the sha256 of the entry's stream, the layer decompressed.
	StreamSHA256 string `json:"streamSHA256"`
}

// Repo is a repository of cache entries. Its methods are safe for concurrent use.
type Repo struct {
	repo name.Repository
	opts []remote.Option
	log  *slog.Logger

	mu     sync.Mutex
	down   bool // nothing more is pulled or pushed
	noPush bool // nothing more is pushed
}

// registryRetry retries a cache request once: a registry that is down costs a bake a second,
// not the minute a base image's pull may wait for one.
var registryRetry = remote.Backoff{Duration: 500 * time.Millisecond, Factor: 2, Jitter: 0.1, Steps: 2}

// New returns the repository repo ("registry.example.com/team/kiln-cache"), reached with opts
// (credentials, user agent) and reporting to log. Registries on the loopback address are
// reached over plain HTTP, others over HTTPS.
func New(repo string, opts []remote.Option, log *slog.Logger) (*Repo, error) {
	r, err := name.NewRepository(repo)
	if err != nil {
		return nil, fmt.Errorf("cache repository %q: %w", repo, err)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	tr := remote.DefaultTransport.(*http.Transport).Clone()
	tr.DialContext = (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	tr.ResponseHeaderTimeout = 30 * time.Second
	o := append([]remote.Option{}, opts...)
	o = append(o, remote.WithTransport(tr), remote.WithRetryBackoff(registryRetry))
	return &Repo{repo: r, opts: o, log: log}, nil
}

// String is the repository's name.
func (r *Repo) String() string { return r.repo.String() }

// Entries are the entries of one kind ("base-trees", "initramfs"): their tags are
// <kind>-<key>.
func (r *Repo) Entries(kind string) Entries { return Entries{r: r, kind: kind} }

// Entries are a Repo's entries of one kind.
type Entries struct {
	r    *Repo
	kind string
}

var tagRE = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$`)

func (e Entries) tag(key string) (name.Tag, error) {
	t := e.kind + "-" + key
	if !tagRE.MatchString(t) {
		return name.Tag{}, fmt.Errorf("cache entry %q is not a valid tag", t)
	}
	return e.r.repo.Tag(t), nil
}

// isDown reports whether the repository could not be reached earlier in this process.
func (r *Repo) isDown() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.down
}

// pushes reports whether entries are still pushed.
func (r *Repo) pushes() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return !r.down && !r.noPush
}

// fail reports, once, that the repository cannot be reached, and stops its use.
func (r *Repo) fail(what string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.down {
		return
	}
	r.down = true
	r.log.Warn("cache repository not used from here on: the bake goes on with the local cache only",
		"repo", r.repo.String(), "failed", what, "err", err)
}

// failPush reports, once, that the repository refused a push, and stops pushing to it: a
// registry that answers but refuses (credentials that may only pull, a read-only
// registry) is still pulled from; one that does not answer is not used at all.
func (r *Repo) failPush(what string, err error) {
	var te *transport.Error
	if !errors.As(err, &te) {
		r.fail(what, err)
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.down || r.noPush {
		return
	}
	r.noPush = true
	r.log.Warn("cache repository refused a push: entries are only pulled from it from here on",
		"repo", r.repo.String(), "failed", what, "err", err)
}

// Get streams entry key to read; see rootfs.Shared. A missing entry is a quiet miss; an entry
// whose blobs or stream fail their checks, or that read refuses, is reported and missed.
func (e Entries) Get(key string, read func(io.Reader) error) bool {
	if e.r.isDown() {
		return false
	}
	tag, err := e.tag(key)
	if err != nil {
		e.r.log.Warn("cache entry not pulled", "err", err)
		return false
	}
	t := time.Now()
	desc, err := remote.Get(tag, e.r.opts...)
	if notFound(err) {
		return false
	}
	if err != nil {
		e.r.fail("pull "+tag.TagStr(), err)
		return false
	}
	n, err := e.fetch(tag, key, desc.Manifest, read)
	if err != nil {
		e.r.log.Warn("cache entry refused: made here instead", "entry", tag.String(), "err", err)
		return false
	}
	e.r.log.Info("cache entry pulled", "entry", tag.String(), "bytes", n, "seconds", time.Since(t).Seconds())
	return true
}

// fetch checks entry tag's manifest and config and streams its layer to read, then reads the
// layer to its end: the digest, the size and the stream's sha256 are checked there.
func (e Entries) fetch(tag name.Tag, key string, manifest []byte, read func(io.Reader) error) (int64, error) {
	m, err := v1.ParseManifest(bytes.NewReader(manifest))
	if err != nil {
		return 0, fmt.Errorf("manifest: %w", err)
	}
	if m.Config.MediaType != ConfigMediaType || len(m.Layers) != 1 || m.Layers[0].MediaType != LayerMediaType {
		return 0, fmt.Errorf("not a kiln cache entry (config %s, %d layers)", m.Config.MediaType, len(m.Layers))
	}
	if m.Config.Size > maxConfig {
		return 0, fmt.Errorf("config of %d bytes", m.Config.Size)
	}
	raw, err := e.blob(m.Config)
	if err != nil {
		return 0, fmt.Errorf("config: %w", err)
	}
	var cfg entryConfig
	if err := json.Unmarshal(raw, &cfg); err != nil {
		return 0, fmt.Errorf("config: %w", err)
	}
	if cfg.Kind != e.kind || cfg.Key != key {
		return 0, fmt.Errorf("config names entry %s-%s", cfg.Kind, cfg.Key)
	}
	layer, err := remote.Layer(tag.Context().Digest(m.Layers[0].Digest.String()), e.r.opts...)
	if err != nil {
		return 0, err
	}
	rc, err := layer.Compressed() // checks the digest when read to the end
	if err != nil {
		return 0, err
	}
	defer rc.Close()
	counted := &countingReader{r: rc}
	// One decoder, on this goroutine: the default one reads ahead on its own goroutines, which
	// would still be reading the layer while it is drained below after read fails, and the
	// layer's digest check is not safe for two readers at once.
	zr, err := zstd.NewReader(counted, zstd.WithDecoderConcurrency(1))
	if err != nil {
		return 0, err
	}
	defer zr.Close()
	h := sha256.New()
	stream := io.TeeReader(zr, h)
	err = read(stream)
	if err == nil {
		// What read left (a tar's padding).
		_, err = io.Copy(io.Discard, stream)
	}
	// The layer to its end: reading to the end is what checks its digest, and a layer that
	// is not what its digest says explains any error before.
	if _, derr := io.Copy(io.Discard, counted); derr != nil {
		return 0, fmt.Errorf("layer %s: %w", m.Layers[0].Digest, derr)
	}
	if err != nil {
		return 0, err
	}
	if counted.n != m.Layers[0].Size {
		return 0, fmt.Errorf("layer of %d bytes, the manifest says %d", counted.n, m.Layers[0].Size)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != cfg.StreamSHA256 {
		return 0, fmt.Errorf("stream sha256 %s, the config says %s", got, cfg.StreamSHA256)
	}
	return counted.n, nil
}

// blob reads the small blob d whole, checked against its digest and size.
func (e Entries) blob(d v1.Descriptor) ([]byte, error) {
	l, err := remote.Layer(e.r.repo.Digest(d.Digest.String()), e.r.opts...)
	if err != nil {
		return nil, err
	}
	rc, err := l.Compressed()
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	data, err := io.ReadAll(io.LimitReader(rc, maxConfig+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) != d.Size {
		return nil, fmt.Errorf("%d bytes, the manifest says %d", len(data), d.Size)
	}
	return data, nil
}

// Put adds the stream write makes under key; see rootfs.Shared. The stream is compressed into
// a temporary file first (its digest goes into the manifest before the upload).
func (e Entries) Put(key string, write func(io.Writer) error) {
	if !e.r.pushes() {
		return
	}
	tag, err := e.tag(key)
	if err != nil {
		e.r.log.Warn("cache entry not pushed", "err", err)
		return
	}
	t := time.Now()
	n, err := e.put(tag, key, write)
	var local localError
	if errors.As(err, &local) {
		e.r.log.Warn("cache entry not pushed", "entry", tag.String(), "err", local.error)
		return
	}
	if err != nil {
		e.r.failPush("push "+tag.TagStr(), err)
		return
	}
	e.r.log.Info("cache entry pushed", "entry", tag.String(), "bytes", n, "seconds", time.Since(t).Seconds())
}

// localError is a failure of put on this machine (the entry's stream, the temporary file),
// not of the registry.
type localError struct{ error }

func (e Entries) put(tag name.Tag, key string, write func(io.Writer) error) (int64, error) {
	f, err := os.CreateTemp("", "kiln-cache-entry-")
	if err != nil {
		return 0, localError{err}
	}
	defer os.Remove(f.Name())
	defer f.Close()
	compressed, stream := sha256.New(), sha256.New()
	counted := &countingWriter{w: io.MultiWriter(f, compressed)}
	zw, err := zstd.NewWriter(counted)
	if err != nil {
		return 0, localError{err}
	}
	if err := write(io.MultiWriter(zw, stream)); err != nil {
		zw.Close()
		return 0, localError{fmt.Errorf("write entry: %w", err)}
	}
	if err := zw.Close(); err != nil {
		return 0, localError{err}
	}
	layer := &fileLayer{
		path:   f.Name(),
		digest: v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(compressed.Sum(nil))},
		size:   counted.n,
	}
	cfg, err := json.Marshal(entryConfig{Kind: e.kind, Key: key, StreamSHA256: hex.EncodeToString(stream.Sum(nil))})
	if err != nil {
		return 0, err
	}
	cfgLayer := static.NewLayer(cfg, ConfigMediaType)
	for _, l := range []v1.Layer{cfgLayer, layer} {
		if err := remote.WriteLayer(e.r.repo, l, e.r.opts...); err != nil {
			return 0, err
		}
	}
	cfgDigest, _ := cfgLayer.Digest()
	m := v1.Manifest{
		SchemaVersion: 2,
		MediaType:     types.OCIManifestSchema1,
		ArtifactType:  ArtifactType,
		Config:        v1.Descriptor{MediaType: ConfigMediaType, Digest: cfgDigest, Size: int64(len(cfg))},
		Layers:        []v1.Descriptor{{MediaType: LayerMediaType, Digest: layer.digest, Size: layer.size}},
	}
	raw, err := json.Marshal(m)
	if err != nil {
		return 0, err
	}
	if err := remote.Put(tag, rawManifest(raw), e.r.opts...); err != nil {
		return 0, err
	}
	return layer.size, nil
}

// notFound reports whether err is a registry's answer that the tag is not there.
func notFound(err error) bool {
	var te *transport.Error
	if !errors.As(err, &te) {
		return false
	}
	if te.StatusCode == http.StatusNotFound {
		return true
	}
	for _, d := range te.Errors {
		if d.Code == transport.ManifestUnknownErrorCode || d.Code == transport.NameUnknownErrorCode {
			return true
		}
	}
	return false
}

// rawManifest is an OCI manifest to put as it is.
type rawManifest []byte

func (m rawManifest) RawManifest() ([]byte, error)        { return m, nil }
func (m rawManifest) MediaType() (types.MediaType, error) { return types.OCIManifestSchema1, nil }

// fileLayer is an entry's compressed stream in a file, of a known digest and size.
type fileLayer struct {
	path   string
	digest v1.Hash
	size   int64
}

func (l *fileLayer) Digest() (v1.Hash, error)            { return l.digest, nil }
func (l *fileLayer) Size() (int64, error)                { return l.size, nil }
func (l *fileLayer) MediaType() (types.MediaType, error) { return LayerMediaType, nil }
func (l *fileLayer) Compressed() (io.ReadCloser, error)  { return os.Open(l.path) }
func (l *fileLayer) DiffID() (v1.Hash, error) {
	return v1.Hash{}, errors.New("a cache entry has no diff ID")
}
func (l *fileLayer) Uncompressed() (io.ReadCloser, error) {
	return nil, errors.New("a cache entry is uploaded compressed")
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}
