package bake

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"path"
	"path/filepath"
	"runtime/debug"
	"strings"
	"time"

	"github.com/kilnproject/kiln/builder/output"
	"github.com/kilnproject/kiln/builder/rootfs"
	"github.com/kilnproject/kiln/builder/sbom"
	"github.com/kilnproject/kiln/internal/atomicfile"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

// writeSBOM writes the image's bill of materials, <image>-<role>.spdx.json (SPDX) and
// <image>-<role>.cdx.json (CycloneDX), to the work directory from the laid tree and md
// (artifacts, images and kernel recorded by then): the tree's Debian packages, the artifacts,
// the pre-pulled images, the Go modules of kiln (this program), kiln-init and kiln-stage1, and
// the kernel. It records the files in md and returns their paths.
func (b *baker) writeSBOM(tree *rootfs.Tree, md *nodeimage.Metadata) ([]string, error) {
	t := time.Now()
	debs, err := sbom.DebianPackages(tree.Dir)
	if err != nil {
		return nil, fmt.Errorf("SBOM: %w", err)
	}
	doc := sbom.Document{Name: b.stem, Created: b.o.Created, Creator: "kiln-" + b.o.Version, Packages: debs}
	for _, a := range md.Artifacts {
		p := sbom.Package{Kind: sbom.KindArtifact, Name: a.Name, SHA256: a.SHA256}
		if strings.HasPrefix(a.Source, "http://") || strings.HasPrefix(a.Source, "https://") {
			p.Download = a.Source
		}
		doc.Packages = append(doc.Packages, p)
	}
	if k := md.Kubernetes; k != nil {
		for _, im := range k.Images {
			doc.Packages = append(doc.Packages, sbom.Package{Kind: sbom.KindImage, Name: im.Name, Version: im.Digest, PURL: imagePURL(im.Name, im.Digest)})
		}
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		doc.Packages = append(doc.Packages, sbom.Modules("kiln", bi)...)
	}
	for _, bin := range []struct{ name, path string }{{"kiln-init", b.o.KilnInit}, {"kiln-stage1", b.o.Stage1}} {
		mods, err := sbom.GoModules(bin.name, bin.path)
		if err != nil {
			// A stand-in that is not a Go program (a test's static binary): listed as a file.
			sum, _, herr := output.HashFile(bin.path)
			if herr != nil {
				return nil, fmt.Errorf("SBOM: %s: %w", bin.name, herr)
			}
			doc.Packages = append(doc.Packages, sbom.Package{Kind: sbom.KindFile, Name: bin.name, SHA256: sum})
			continue
		}
		doc.Packages = append(doc.Packages, mods...)
	}
	doc.Packages = append(doc.Packages, sbom.Package{Kind: sbom.KindKernel, Name: "linux", Version: md.Kernel.Version})
	var files []string
	var written []nodeimage.FileDigest
	for _, f := range []struct {
		suffix string
		encode func() ([]byte, error)
	}{{".spdx.json", doc.SPDX}, {".cdx.json", doc.CycloneDX}} {
		data, err := f.encode()
		if err != nil {
			return nil, fmt.Errorf("SBOM: %w", err)
		}
		file := filepath.Join(b.work, b.stem+f.suffix)
		if err := atomicfile.Write(file, data, atomicfile.Options{Mode: 0o644}); err != nil {
			return nil, fmt.Errorf("SBOM: %w", err)
		}
		sum := sha256.Sum256(data)
		files = append(files, file)
		written = append(written, nodeimage.FileDigest{File: filepath.Base(file), SHA256: hex.EncodeToString(sum[:])})
	}
	md.SBOM = &nodeimage.SBOMInfo{File: written[0].File, SHA256: written[0].SHA256, CycloneDX: &written[1], Packages: doc.Counts()}
	b.step("SBOM written", t, "packages", len(doc.Packages))
	return files, nil
}

// imagePURL is the package URL of a container image: pkg:oci/<name>@<digest> with the
// repository it is named in.
func imagePURL(name, digest string) string {
	repo := name
	if i := strings.LastIndex(repo, "@"); i >= 0 {
		repo = repo[:i]
	}
	if i := strings.LastIndex(repo, ":"); i > strings.LastIndex(repo, "/") {
		repo = repo[:i]
	}
	return "pkg:oci/" + path.Base(repo) + "@" + strings.Replace(digest, ":", "%3A", 1) + "?repository_url=" + repo
}
