package bake

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/kilnproject/kiln/builder/artifact"
	"github.com/kilnproject/kiln/builder/output"
	"github.com/kilnproject/kiln/builder/provenance"
	"github.com/kilnproject/kiln/internal/atomicfile"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

// writeProvenance signs, with Options.SignKey, an in-toto statement with SLSA provenance of
// this bake: every output of md (the pxe files one by one), the SBOM and the metadata file
// mdFile as subjects; the definition and lock files, the base, every artifact and image and
// the two node binaries as resolved dependencies. It writes <image>-<role>.intoto.jsonl to
// the work directory and returns its path.
func (b *baker) writeProvenance(md *nodeimage.Metadata, mdFile string) (string, error) {
	t := time.Now()
	var subjects []provenance.Subject
	for _, o := range md.Outputs {
		subjects = append(subjects, provenance.Subject{Name: o.File, Digest: provenance.SHA256(o.SHA256)})
	}
	if md.SBOM != nil {
		for _, f := range md.SBOM.Files() {
			subjects = append(subjects, provenance.Subject{Name: f.File, Digest: provenance.SHA256(f.SHA256)})
		}
	}
	// Every file named below is hashed now; one that cannot be read fails the bake rather than
	// being signed with no digest.
	var hashErr error
	digest := func(p string) map[string]string {
		sum, _, err := output.HashFile(p)
		if err != nil && hashErr == nil {
			hashErr = err
		}
		return provenance.SHA256(sum)
	}
	subjects = append(subjects, provenance.Subject{Name: filepath.Base(mdFile), Digest: digest(mdFile)})

	deps := []provenance.ResourceDescriptor{{Name: "definition", URI: b.o.Definition, Digest: digest(b.def.File)}}
	if lock := artifact.LockPath(b.def); fileExists(lock) {
		deps = append(deps, provenance.ResourceDescriptor{Name: "lock", URI: lock, Digest: digest(lock)})
	}
	for _, ov := range b.o.ProfileOverlays {
		deps = append(deps, provenance.ResourceDescriptor{Name: "profile overlay", URI: ov, Digest: digest(ov)})
	}
	deps = append(deps, provenance.ResourceDescriptor{Name: "base", URI: md.Base.Ref, Digest: provenance.SHA256(strings.TrimPrefix(md.Base.Digest, "sha256:"))})
	for _, a := range md.Artifacts {
		deps = append(deps, provenance.ResourceDescriptor{Name: "artifact " + a.Name, URI: a.Source, Digest: provenance.SHA256(a.SHA256)})
	}
	if k := md.Kubernetes; k != nil {
		for _, im := range k.Images {
			deps = append(deps, provenance.ResourceDescriptor{Name: "image", URI: im.Name, Digest: provenance.SHA256(strings.TrimPrefix(im.Digest, "sha256:"))})
		}
	}
	deps = append(deps,
		provenance.ResourceDescriptor{Name: "kiln-init", Digest: digest(b.o.KilnInit)},
		provenance.ResourceDescriptor{Name: "kiln-stage1", Digest: digest(b.o.Stage1)})
	if hashErr != nil {
		return "", fmt.Errorf("provenance: %w", hashErr)
	}
	params := map[string]string{"definition": b.o.Definition, "role": b.o.Role}
	st := provenance.NewStatement(subjects, params, deps, b.o.Version)
	data, err := provenance.Sign(st, b.o.SignKey)
	if err != nil {
		return "", fmt.Errorf("provenance: %w", err)
	}
	file := filepath.Join(b.work, b.stem+provenance.EnvelopeSuffix)
	if err := atomicfile.Write(file, data, atomicfile.Options{Mode: 0o644}); err != nil {
		return "", fmt.Errorf("provenance: %w", err)
	}
	b.step("provenance signed", t, "subjects", len(subjects))
	return file, nil
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
