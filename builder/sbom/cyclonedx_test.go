package sbom

import (
	"bytes"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	cdx "github.com/CycloneDX/cyclonedx-go"
)

// The CycloneDX document is what CycloneDX's own Go library reads: spec 1.6, the image as
// the metadata's component depending on every package, each with its type, purl and digest;
// the same packages in another order give the same bytes.
func TestCycloneDX(t *testing.T) {
	pkgs := []Package{
		{Kind: KindImage, Name: "registry.k8s.io/pause:3.10.2", Version: "sha256:ab", PURL: "pkg:oci/pause@sha256%3Aab?repository_url=registry.k8s.io/pause"},
		{Kind: KindArtifact, Name: "crictl", Download: "https://example.com/crictl.tar.gz", SHA256: strings.Repeat("c", 64)},
		{Kind: KindKernel, Name: "linux", Version: "6.1.0-57-cloud-amd64"},
		{Kind: KindDeb, Name: "libc6", Version: "2.36", Arch: "amd64", PURL: "pkg:deb/debian/libc6@2.36?arch=amd64"},
		{Kind: KindGo, Name: "golang.org/x/sys", Version: "v0.40.0", PURL: "pkg:golang/golang.org/x/sys@v0.40.0", Of: "kiln-init"},
	}
	d := Document{Name: "qemu-worker", Created: time.Unix(1.7e9, 0), Creator: "kiln-v1.2.3", Packages: pkgs}
	a, err := d.CycloneDX()
	if err != nil {
		t.Fatal(err)
	}
	slices.Reverse(d.Packages)
	if b, _ := d.CycloneDX(); !bytes.Equal(a, b) {
		t.Error("the same packages in another order gave other bytes")
	}
	d.Packages = d.Packages[1:]
	if b, _ := d.CycloneDX(); bytes.Equal(a, b) {
		t.Error("a package less gave the same bytes")
	}

	var bom cdx.BOM
	if err := cdx.NewBOMDecoder(bytes.NewReader(a), cdx.BOMFileFormatJSON).Decode(&bom); err != nil {
		t.Fatal(err)
	}
	if bom.BOMFormat != "CycloneDX" || bom.SpecVersion != cdx.SpecVersion1_6 || bom.Version != 1 {
		t.Errorf("bomFormat %q, spec %v, version %d", bom.BOMFormat, bom.SpecVersion, bom.Version)
	}
	if !regexp.MustCompile(`^urn:uuid:[0-9a-f]{8}-[0-9a-f]{4}-[1-5][0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`).MatchString(bom.SerialNumber) {
		t.Errorf("serial number %q is not the schema's urn:uuid", bom.SerialNumber)
	}
	md := bom.Metadata
	if md == nil || md.Component == nil || md.Component.Name != "qemu-worker" || md.Component.Type != cdx.ComponentTypeOS ||
		md.Timestamp != "2023-11-14T22:13:20Z" || md.Tools == nil || md.Tools.Components == nil ||
		(*md.Tools.Components)[0].Name != "kiln" || (*md.Tools.Components)[0].Version != "v1.2.3" {
		t.Fatalf("metadata %+v", md)
	}
	comps := *bom.Components
	if len(comps) != len(pkgs) {
		t.Fatalf("%d components, want %d", len(comps), len(pkgs))
	}
	want := map[string]cdx.ComponentType{"libc6": cdx.ComponentTypeLibrary, "crictl": cdx.ComponentTypeFile,
		"registry.k8s.io/pause:3.10.2": cdx.ComponentTypeContainer, "golang.org/x/sys": cdx.ComponentTypeLibrary, "linux": cdx.ComponentTypeOS}
	for _, c := range comps {
		if c.Type != want[c.Name] {
			t.Errorf("%s: type %q, want %q", c.Name, c.Type, want[c.Name])
		}
	}
	if c := comps[0]; c.Name != "libc6" || c.PackageURL != "pkg:deb/debian/libc6@2.36?arch=amd64" {
		t.Errorf("first component %+v, want the Debian package", c)
	}
	for _, c := range comps {
		if c.Name == "crictl" && (c.Hashes == nil || (*c.Hashes)[0].Algorithm != cdx.HashAlgoSHA256 || (*c.Hashes)[0].Value != strings.Repeat("c", 64) ||
			c.ExternalReferences == nil || (*c.ExternalReferences)[0].URL != "https://example.com/crictl.tar.gz") {
			t.Errorf("crictl: hashes %v, references %v", c.Hashes, c.ExternalReferences)
		}
	}
	deps := *bom.Dependencies
	if len(deps) != 1 || deps[0].Ref != "image" || deps[0].Dependencies == nil || len(*deps[0].Dependencies) != len(pkgs) {
		t.Errorf("dependencies %+v: want the image depending on every component", deps)
	}
}
