package artifact

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Image opens the cached image as a v1.Image read from the cache c, for flattening its layers.
// The manifest and the config are hashed again as they are read; a layer's blob was hashed when
// it was stored, and readers of its bytes (rootfs.FlattenWith) take it from the cache by digest.
func (ci *CachedImage) Image(c *Cache) (v1.Image, error) {
	return partial.CompressedToImage(cachedCore{c: c, ci: ci})
}

type cachedCore struct {
	c  *Cache
	ci *CachedImage
}

func (cc cachedCore) read(d v1.Descriptor) ([]byte, error) {
	p, ok := cc.c.Has(d.Digest.Hex)
	if !ok {
		return nil, fmt.Errorf("image %s: blob %s is not in the cache %s", cc.ci.Name, d.Digest, cc.c.Root)
	}
	data, err := os.ReadFile(p)
	if err != nil {
		return nil, err
	}
	if sum := sha256.Sum256(data); hex.EncodeToString(sum[:]) != d.Digest.Hex {
		return nil, fmt.Errorf("image %s: cached blob %s does not hash to its name (damaged cache; remove it and bake again)", cc.ci.Name, p)
	}
	return data, nil
}

func (cc cachedCore) RawManifest() ([]byte, error)        { return cc.read(cc.ci.Manifest) }
func (cc cachedCore) RawConfigFile() ([]byte, error)      { return cc.read(cc.ci.Config) }
func (cc cachedCore) MediaType() (types.MediaType, error) { return cc.ci.Manifest.MediaType, nil }

func (cc cachedCore) LayerByDigest(h v1.Hash) (partial.CompressedLayer, error) {
	for _, l := range cc.ci.Layers {
		if l.Digest == h {
			return cachedLayer{c: cc.c, d: l}, nil
		}
	}
	return nil, fmt.Errorf("image %s: no layer %s", cc.ci.Name, h)
}

type cachedLayer struct {
	c *Cache
	d v1.Descriptor
}

func (l cachedLayer) Digest() (v1.Hash, error)            { return l.d.Digest, nil }
func (l cachedLayer) Size() (int64, error)                { return l.d.Size, nil }
func (l cachedLayer) MediaType() (types.MediaType, error) { return l.d.MediaType, nil }
func (l cachedLayer) Compressed() (io.ReadCloser, error) {
	p, ok := l.c.Has(l.d.Digest.Hex)
	if !ok {
		return nil, fmt.Errorf("layer %s is not in the cache %s", l.d.Digest, l.c.Root)
	}
	return os.Open(p)
}
