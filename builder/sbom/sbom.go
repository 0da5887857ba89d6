// Package sbom writes a node image's software bill of materials as an SPDX 2.3 JSON document:
// the Debian packages installed in its root (read from the tree's dpkg status, so a foreign
// Debian-based base works too), the artifacts the profile pinned, the pre-pulled container
// images, the Go modules of the kiln binaries it carries (their build information) and its
// kernel. The same inputs give the same bytes: packages are sorted, the creation time is the
// bake's, and the document's namespace is derived from its content.
package sbom

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"debug/buildinfo"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"github.com/kilnproject/kiln/internal/percent"
)

// The kinds of package an SBOM lists.
const (
	KindDeb      = "deb"
	KindArtifact = "artifact"
	KindImage    = "image"
	KindGo       = "go"
	KindKernel   = "kernel"
	// KindFile is a binary kiln lays without Go build information (a test's stand-in).
	KindFile = "file"
)

// Kinds are the package kinds, in the order the document lists them.
var Kinds = []string{KindDeb, KindArtifact, KindImage, KindGo, KindFile, KindKernel}

// Package is one thing the image holds.
type Package struct {
	Kind    string
	Name    string
	Version string
	// Arch is a Debian package's architecture.
	Arch string
	// PURL is the package URL naming it, when there is a purl type for it.
	PURL string
	// Download is where it came from, "" when not known.
	Download string
	// SHA256 is the hex SHA-256 of what was downloaded (an artifact), or "".
	SHA256 string
	// Of names what holds it: the binary a Go module is built into.
	Of string
}

// Document is an image's bill of materials.
type Document struct {
	// Name is the image's, <image>-<role>.
	Name string
	// Created is the bake's creation time (SOURCE_DATE_EPOCH).
	Created time.Time
	// Creator is the tool that made it, "kiln-<version>".
	Creator  string
	Packages []Package
}

// DebianPackages reads the packages installed in the root tree at root from its dpkg status
// file; distro qualifies their package URLs (debian-12, from the tree's os-release). A tree
// without a dpkg database has none.
func DebianPackages(root string) ([]Package, error) {
	// Read through os.Root: the tree's links (Debian's /var/lib/dpkg may be one, as kiln's
	// base makes it) resolve inside the tree, never on the host.
	r, err := os.OpenRoot(root)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	status := filepath.Join(root, "var/lib/dpkg/status")
	data, err := r.ReadFile("var/lib/dpkg/status")
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	vendor, distro := osRelease(r)
	var pkgs []Package
	for i, para := range bytes.Split(data, []byte("\n\n")) {
		f := fields(para)
		if len(f) == 0 {
			continue
		}
		if !strings.HasSuffix(f["Status"], " installed") {
			continue
		}
		p := Package{Kind: KindDeb, Name: f["Package"], Version: f["Version"], Arch: f["Architecture"]}
		if p.Name == "" || p.Version == "" {
			return nil, fmt.Errorf("%s: paragraph %d: an installed package without Package or Version", status, i+1)
		}
		p.PURL = "pkg:deb/" + vendor + "/" + p.Name + "@" + purlEscape(p.Version) + "?arch=" + p.Arch
		if distro != "" {
			p.PURL += "&distro=" + distro
		}
		pkgs = append(pkgs, p)
	}
	return pkgs, nil
}

// fields are a deb822 paragraph's fields (continuation lines dropped: none of those read here
// has one).
func fields(para []byte) map[string]string {
	f := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(para))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == ' ' || line[0] == '\t' {
			continue
		}
		if k, v, ok := strings.Cut(line, ":"); ok {
			f[k] = strings.TrimSpace(v)
		}
	}
	return f
}

// osRelease is the purl namespace (os-release's ID, "debian" by default) and distro qualifier
// (ID-VERSION_ID, "debian-12") of the tree root.
func osRelease(root *os.Root) (vendor, distro string) {
	vendor = "debian"
	var data []byte
	for _, p := range []string{"etc/os-release", "usr/lib/os-release"} {
		if b, err := root.ReadFile(p); err == nil {
			data = b
			break
		}
	}
	var id, version string
	for _, line := range strings.Split(string(data), "\n") {
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			continue
		}
		v = strings.Trim(v, `"'`)
		switch k {
		case "ID":
			id = v
		case "VERSION_ID":
			version = v
		}
	}
	if id != "" {
		vendor = id
	}
	if id != "" && version != "" {
		distro = id + "-" + version
	}
	return vendor, distro
}

// GoModules lists the main module and the dependencies the Go binary at path was built with,
// from its build information; name is how the SBOM calls the binary.
func GoModules(name, path string) ([]Package, error) {
	bi, err := buildinfo.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%s: Go build information: %w", path, err)
	}
	return Modules(name, bi), nil
}

// Modules lists the main module and the dependencies of a Go binary's build information bi
// (the running program's, from runtime/debug.ReadBuildInfo, or a file's).
func Modules(name string, bi *debug.BuildInfo) []Package {
	pkgs := []Package{{Kind: KindGo, Name: bi.Main.Path, Version: bi.Main.Version, Of: name,
		PURL: "pkg:golang/" + bi.Main.Path + "@" + purlEscape(bi.Main.Version)}}
	pkgs = append(pkgs, Package{Kind: KindGo, Name: "stdlib", Version: bi.GoVersion, Of: name,
		PURL: "pkg:golang/stdlib@" + purlEscape(bi.GoVersion)})
	for _, d := range bi.Deps {
		if d.Replace != nil {
			d = d.Replace
		}
		pkgs = append(pkgs, Package{Kind: KindGo, Name: d.Path, Version: d.Version, Of: name,
			PURL: "pkg:golang/" + d.Path + "@" + purlEscape(d.Version)})
	}
	return pkgs
}

// purlEscape percent-encodes a purl version: everything but letters, digits and . - _ ~ +.
func purlEscape(s string) string { return percent.Encode(s, "+") }

// Counts are how many packages of each kind d lists.
func (d *Document) Counts() map[string]int {
	n := map[string]int{}
	for _, p := range d.Packages {
		n[p.Kind]++
	}
	return n
}

// sorted is d's packages in the document's order: by kind (Kinds' order), then what holds
// them, name, version and architecture.
func (d *Document) sorted() []Package {
	pkgs := slices.Clone(d.Packages)
	slices.SortStableFunc(pkgs, func(a, b Package) int {
		if c := slices.Index(Kinds, a.Kind) - slices.Index(Kinds, b.Kind); c != 0 {
			return c
		}
		for _, c := range [][2]string{{a.Of, b.Of}, {a.Name, b.Name}, {a.Version, b.Version}, {a.Arch, b.Arch}} {
			if r := strings.Compare(c[0], c[1]); r != 0 {
				return r
			}
		}
		return 0
	})
	return pkgs
}

// The SPDX 2.3 JSON document, the fields kiln writes.
type spdxDocument struct {
	SPDXVersion       string             `json:"spdxVersion"`
	DataLicense       string             `json:"dataLicense"`
	SPDXID            string             `json:"SPDXID"`
	Name              string             `json:"name"`
	DocumentNamespace string             `json:"documentNamespace"`
	CreationInfo      spdxCreationInfo   `json:"creationInfo"`
	Packages          []spdxPackage      `json:"packages"`
	Relationships     []spdxRelationship `json:"relationships"`
}

type spdxCreationInfo struct {
	Created  string   `json:"created"`
	Creators []string `json:"creators"`
}

type spdxPackage struct {
	Name                  string            `json:"name"`
	SPDXID                string            `json:"SPDXID"`
	VersionInfo           string            `json:"versionInfo,omitempty"`
	DownloadLocation      string            `json:"downloadLocation"`
	FilesAnalyzed         bool              `json:"filesAnalyzed"`
	PrimaryPackagePurpose string            `json:"primaryPackagePurpose,omitempty"`
	Checksums             []spdxChecksum    `json:"checksums,omitempty"`
	ExternalRefs          []spdxExternalRef `json:"externalRefs,omitempty"`
	Comment               string            `json:"comment,omitempty"`
}

type spdxChecksum struct {
	Algorithm     string `json:"algorithm"`
	ChecksumValue string `json:"checksumValue"`
}

type spdxExternalRef struct {
	ReferenceCategory string `json:"referenceCategory"`
	ReferenceType     string `json:"referenceType"`
	ReferenceLocator  string `json:"referenceLocator"`
}

type spdxRelationship struct {
	SPDXElementID      string `json:"spdxElementId"`
	RelationshipType   string `json:"relationshipType"`
	RelatedSPDXElement string `json:"relatedSpdxElement"`
}

// purposes are the SPDX primary package purposes of the kinds.
var purposes = map[string]string{KindDeb: "LIBRARY", KindArtifact: "FILE", KindImage: "CONTAINER", KindGo: "LIBRARY", KindFile: "FILE", KindKernel: "OPERATING-SYSTEM"}

// SPDX is d as an SPDX 2.3 JSON document: the image as the described package, containing
// every package of d.
func (d *Document) SPDX() ([]byte, error) {
	const image = "SPDXRef-Image"
	doc := spdxDocument{
		SPDXVersion: "SPDX-2.3", DataLicense: "CC0-1.0", SPDXID: "SPDXRef-DOCUMENT", Name: d.Name,
		CreationInfo: spdxCreationInfo{Created: d.Created.UTC().Format(time.RFC3339), Creators: []string{"Tool: " + d.Creator}},
		Packages: []spdxPackage{{Name: d.Name, SPDXID: image, DownloadLocation: "NOASSERTION",
			PrimaryPackagePurpose: "OPERATING-SYSTEM", Comment: "the node image kiln baked"}},
		Relationships: []spdxRelationship{{"SPDXRef-DOCUMENT", "DESCRIBES", image}},
	}
	for i, p := range d.sorted() {
		id := fmt.Sprintf("SPDXRef-%s-%d", p.Kind, i+1)
		sp := spdxPackage{Name: p.Name, SPDXID: id, VersionInfo: p.Version, DownloadLocation: "NOASSERTION",
			PrimaryPackagePurpose: purposes[p.Kind]}
		if p.Download != "" {
			sp.DownloadLocation = p.Download
		}
		if p.SHA256 != "" {
			sp.Checksums = []spdxChecksum{{"SHA256", p.SHA256}}
		}
		if p.PURL != "" {
			sp.ExternalRefs = []spdxExternalRef{{"PACKAGE-MANAGER", "purl", p.PURL}}
		}
		if p.Of != "" {
			sp.Comment = "built into " + p.Of
		}
		doc.Packages = append(doc.Packages, sp)
		doc.Relationships = append(doc.Relationships, spdxRelationship{image, "CONTAINS", id})
	}
	// The namespace is unique to the content: the document without it, hashed.
	body, err := json.Marshal(doc)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(body)
	doc.DocumentNamespace = "https://spdx.kiln.invalid/" + d.Name + "/" + hex.EncodeToString(sum[:16])
	out, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(out, '\n'), nil
}

// The CycloneDX 1.6 JSON document, the fields kiln writes.
type cdxDocument struct {
	BOMFormat    string          `json:"bomFormat"`
	SpecVersion  string          `json:"specVersion"`
	SerialNumber string          `json:"serialNumber,omitempty"`
	Version      int             `json:"version"`
	Metadata     cdxMetadata     `json:"metadata"`
	Components   []cdxComponent  `json:"components"`
	Dependencies []cdxDependency `json:"dependencies"`
}

type cdxMetadata struct {
	Timestamp string       `json:"timestamp"`
	Tools     cdxTools     `json:"tools"`
	Component cdxComponent `json:"component"`
}

type cdxTools struct {
	Components []cdxComponent `json:"components"`
}

type cdxComponent struct {
	BOMRef             string        `json:"bom-ref,omitempty"`
	Type               string        `json:"type"`
	Name               string        `json:"name"`
	Version            string        `json:"version,omitempty"`
	Description        string        `json:"description,omitempty"`
	Hashes             []cdxHash     `json:"hashes,omitempty"`
	PURL               string        `json:"purl,omitempty"`
	ExternalReferences []cdxExtRef   `json:"externalReferences,omitempty"`
	Properties         []cdxProperty `json:"properties,omitempty"`
}

type cdxHash struct {
	Alg     string `json:"alg"`
	Content string `json:"content"`
}

type cdxExtRef struct {
	Type string `json:"type"`
	URL  string `json:"url"`
}

type cdxProperty struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

type cdxDependency struct {
	Ref       string   `json:"ref"`
	DependsOn []string `json:"dependsOn,omitempty"`
}

// cdxTypes are the CycloneDX component types of the kinds.
var cdxTypes = map[string]string{KindDeb: "library", KindArtifact: "file", KindImage: "container", KindGo: "library", KindFile: "file", KindKernel: "operating-system"}

// CycloneDX is d as a CycloneDX 1.6 JSON document: the image as the metadata's component,
// depending on every package of d, which are its components (in SPDX's order, with the same
// purls and digests). kiln's own fields are properties named kiln:kind, kiln:arch and kiln:of.
// The serial number is derived from the content, so the same inputs give the same bytes.
func (d *Document) CycloneDX() ([]byte, error) {
	const image = "image"
	tool, version, _ := strings.Cut(d.Creator, "-")
	doc := cdxDocument{
		BOMFormat: "CycloneDX", SpecVersion: "1.6", Version: 1,
		Metadata: cdxMetadata{
			Timestamp: d.Created.UTC().Format(time.RFC3339),
			Tools:     cdxTools{Components: []cdxComponent{{Type: "application", Name: tool, Version: version}}},
			Component: cdxComponent{BOMRef: image, Type: "operating-system", Name: d.Name, Description: "the node image kiln baked"},
		},
		Components: []cdxComponent{},
	}
	deps := cdxDependency{Ref: image}
	for i, p := range d.sorted() {
		c := cdxComponent{BOMRef: fmt.Sprintf("%s-%d", p.Kind, i+1), Type: cdxTypes[p.Kind], Name: p.Name, Version: p.Version, PURL: p.PURL,
			Properties: []cdxProperty{{"kiln:kind", p.Kind}}}
		if p.SHA256 != "" {
			c.Hashes = []cdxHash{{"SHA-256", p.SHA256}}
		}
		if p.Download != "" {
			c.ExternalReferences = []cdxExtRef{{"distribution", p.Download}}
		}
		if p.Arch != "" {
			c.Properties = append(c.Properties, cdxProperty{"kiln:arch", p.Arch})
		}
		if p.Of != "" {
			c.Properties = append(c.Properties, cdxProperty{"kiln:of", p.Of})
		}
		doc.Components = append(doc.Components, c)
		deps.DependsOn = append(deps.DependsOn, c.BOMRef)
	}
	doc.Dependencies = []cdxDependency{deps}
	// The serial number is unique to the content: a name-based UUID (version 5's layout) of
	// the document without it.
	body, err := json.Marshal(doc)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(body)
	u := sum[:16]
	u[6] = u[6]&0x0f | 0x50
	u[8] = u[8]&0x3f | 0x80
	doc.SerialNumber = fmt.Sprintf("urn:uuid:%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
	out, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(out, '\n'), nil
}
