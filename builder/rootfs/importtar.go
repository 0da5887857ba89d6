package rootfs

import (
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/match"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/kilnproject/kiln/builder/artifact"
)

// ImportTar turns a root filesystem tarball into a one-layer OCI image (linux/amd64) and stores
// it in the OCI layout at dir under tag, replacing an older image with the same tag. It returns
// the manifest digest, which is what image definitions pin.
func ImportTar(tarPath, dir, tag string, created time.Time) (v1.Hash, error) {
	if _, err := os.Stat(tarPath); err != nil {
		return v1.Hash{}, fmt.Errorf("import %s: %w", tarPath, err)
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return os.Open(tarPath) },
		tarball.WithMediaType(types.OCILayer),
		tarball.WithCompressionLevel(gzip.BestSpeed),
		tarball.WithCompressedCaching)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("import %s: %w", tarPath, err)
	}
	base := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	base = mutate.ConfigMediaType(base, types.OCIConfigJSON)
	img, err := mutate.Append(base, mutate.Addendum{Layer: layer, MediaType: types.OCILayer,
		History: v1.History{CreatedBy: "kiln base import " + tarPath, Created: v1.Time{Time: created}}})
	if err != nil {
		return v1.Hash{}, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return v1.Hash{}, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Created = v1.Time{Time: created}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return v1.Hash{}, err
	}
	p, err := layout.FromPath(dir)
	if errors.Is(err, os.ErrNotExist) || (err == nil && !IsLayout(dir)) {
		p, err = layout.Write(dir, empty.Index)
	}
	if err != nil {
		return v1.Hash{}, fmt.Errorf("open layout %s: %w", dir, err)
	}
	ann := map[string]string{artifact.RefNameAnnotation: tag}
	if err := p.ReplaceImage(img, match.Name(tag), layout.WithAnnotations(ann)); err != nil {
		return v1.Hash{}, fmt.Errorf("write %s to layout %s: %w", tag, dir, err)
	}
	return img.Digest()
}

// IsLayout says whether dir is an OCI image layout: it has an index.json.
func IsLayout(dir string) bool {
	_, err := os.Stat(dir + "/index.json")
	return err == nil
}
