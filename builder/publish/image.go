package publish

import (
	"crypto"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/kilnproject/kiln/builder/output"
	"github.com/kilnproject/kiln/builder/provenance"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

// Image is one output file of a bake, with the metadata the bake wrote beside it.
type Image struct {
	Path     string              // the output file
	Metadata *nodeimage.Metadata // <stem>.json beside it
	Output   nodeimage.OutputInfo
	SHA256   string // hex digest of the whole file, from the metadata: the image's identity
	// Provenance is the image's signed provenance, checked by VerifyProvenance; nil when
	// none was asked for. A publisher records its digest on the cloud image.
	Provenance *provenance.Signed

	metadataPath string
	metadataData []byte
}

var hexDigest = regexp.MustCompile(`^[0-9a-f]{64}$`)

// Load reads the metadata of the bake output at path (<stem>.json in the same directory, the
// stem being the file name without its format's suffix), finds the file's entry in its outputs
// and checks the file's size against it. The file's content is checked against the digest by
// whoever reads it.
func Load(path string) (*Image, error) {
	format := output.OfFile(path)
	if format == "" {
		return nil, fmt.Errorf("%s: not a bake output (no known format suffix: %s)", path, strings.Join(output.Names(), ", "))
	}
	f, _ := output.Lookup(format)
	name := filepath.Base(path)
	sidecar := filepath.Join(filepath.Dir(path), strings.TrimSuffix(name, f.Suffix)+".json")
	data, err := os.ReadFile(sidecar)
	if err != nil {
		return nil, fmt.Errorf("%s: the image metadata: %w", path, err)
	}
	md := new(nodeimage.Metadata)
	if err := json.Unmarshal(data, md); err != nil {
		return nil, fmt.Errorf("%s: %w", sidecar, err)
	}
	im := &Image{Path: path, Metadata: md, metadataPath: sidecar, metadataData: data}
	found := false
	for _, o := range md.Outputs {
		if o.File == name {
			im.Output, found = o, true
		}
	}
	if !found {
		return nil, fmt.Errorf("%s: outputs has no entry for %s", sidecar, name)
	}
	if !hexDigest.MatchString(im.Output.SHA256) {
		return nil, fmt.Errorf("%s: outputs[%s].sha256 %q is not a hex SHA-256 (bake it again with this kiln)", sidecar, name, im.Output.SHA256)
	}
	im.SHA256 = im.Output.SHA256
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if fi.Size() != im.Output.Size {
		return nil, fmt.Errorf("%s: %d bytes, but %s says %d: not the file the bake wrote", path, fi.Size(), sidecar, im.Output.Size)
	}
	return im, nil
}

// Format is the output format of the image ("raw", "gce", …).
func (im *Image) Format() string { return im.Output.Format }

// DiskSize is the size of the disk the image holds: the disk's size from the metadata, or the
// file's size when the metadata has no disk.
func (im *Image) DiskSize() int64 {
	if d := im.Metadata.Disk; d != nil && d.Size > 0 {
		return d.Size
	}
	return im.Output.Size
}

// VerifyProvenance checks the image's signed provenance with pub (its envelope beside the
// metadata, see provenance.VerifyImage) and that it names the output file with the metadata's
// digest, then keeps it in im.Provenance. The file itself is hashed against that digest before
// any request, as without a key; so what is published is what was signed.
func (im *Image) VerifyProvenance(pub crypto.PublicKey) error {
	signed, err := provenance.VerifyImage(im.metadataPath, im.metadataData, pub)
	if err != nil {
		return fmt.Errorf("%s: %w", im.Path, err)
	}
	got, ok := signed.Statement.SubjectSHA256(im.Output.File)
	switch {
	case !ok:
		return fmt.Errorf("%s: the provenance %s does not name it among its subjects", im.Path, filepath.Base(signed.File))
	case got != im.SHA256:
		return fmt.Errorf("%s: the provenance %s says sha256 %s, the metadata %s", im.Path, filepath.Base(signed.File), got, im.SHA256)
	}
	im.Provenance = signed
	return nil
}

// ProvenanceSHA256 is the hex digest of the image's checked provenance envelope, or "".
func (im *Image) ProvenanceSHA256() string {
	if im.Provenance == nil {
		return ""
	}
	return im.Provenance.SHA256
}
