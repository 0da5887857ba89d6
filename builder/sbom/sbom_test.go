package sbom

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// The packages read from a dpkg status are those dpkg-query lists as installed, with the same
// versions and architectures: checked on this machine's own dpkg database, a real Debian one.
func TestDebianPackagesAsDpkgQuerySeesThem(t *testing.T) {
	if _, err := exec.LookPath("dpkg-query"); err != nil {
		t.Skip("dpkg-query is not installed (a Debian host has it)")
	}
	out, err := exec.Command("dpkg-query", "--admindir=/var/lib/dpkg", "-W", "-f", `${db:Status-Abbrev}\t${Package}\t${Version}\t${Architecture}\n`).Output()
	if err != nil {
		t.Fatalf("dpkg-query: %v", err)
	}
	var want []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Split(line, "\t")
		if len(f) == 4 && len(f[0]) >= 2 && f[0][1] == 'i' {
			want = append(want, f[1]+" "+f[2]+" "+f[3])
		}
	}
	pkgs, err := DebianPackages("/")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range pkgs {
		got = append(got, p.Name+" "+p.Version+" "+p.Arch)
	}
	slices.Sort(want)
	slices.Sort(got)
	if len(want) < 100 || !slices.Equal(got, want) {
		t.Errorf("read %d installed packages, dpkg-query lists %d; first differences: %v", len(got), len(want), firstDiff(got, want))
	}
}

func firstDiff(a, b []string) []string {
	var d []string
	for _, x := range a {
		if !slices.Contains(b, x) {
			d = append(d, "only read: "+x)
		}
	}
	for _, x := range b {
		if !slices.Contains(a, x) {
			d = append(d, "only dpkg-query: "+x)
		}
	}
	return d[:min(len(d), 5)]
}

// A tree's status: only installed packages count, versions with an epoch are escaped in the
// purl, and the distro comes from the tree's os-release.
func TestDebianPackagesOfATree(t *testing.T) {
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "var/lib/dpkg"), 0o755)
	os.MkdirAll(filepath.Join(root, "etc"), 0o755)
	// /etc/os-release a link to /usr/lib/os-release, resolved in the tree, as in Debian.
	os.MkdirAll(filepath.Join(root, "usr/lib"), 0o755)
	os.Symlink("../usr/lib/os-release", filepath.Join(root, "etc/os-release"))
	os.WriteFile(filepath.Join(root, "usr/lib/os-release"), []byte("PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nID=debian\nVERSION_ID=\"12\"\n"), 0o644)
	os.WriteFile(filepath.Join(root, "var/lib/dpkg/status"), []byte(`Package: libc6
Status: install ok installed
Architecture: amd64
Version: 2.36-9+deb12u4
Description: GNU C Library
 a continuation line: with a colon

Package: gone
Status: deinstall ok config-files
Architecture: amd64
Version: 1.0

Package: systemd
Status: hold ok installed
Architecture: amd64
Version: 1:252.39-1~deb12u2
`), 0o644)
	pkgs, err := DebianPackages(root)
	if err != nil {
		t.Fatal(err)
	}
	want := []Package{
		{Kind: KindDeb, Name: "libc6", Version: "2.36-9+deb12u4", Arch: "amd64", PURL: "pkg:deb/debian/libc6@2.36-9+deb12u4?arch=amd64&distro=debian-12"},
		{Kind: KindDeb, Name: "systemd", Version: "1:252.39-1~deb12u2", Arch: "amd64", PURL: "pkg:deb/debian/systemd@1%3A252.39-1~deb12u2?arch=amd64&distro=debian-12"},
	}
	if !slices.Equal(pkgs, want) {
		t.Errorf("packages:\n%+v\nwant\n%+v", pkgs, want)
	}
	if pkgs, err := DebianPackages(t.TempDir()); err != nil || len(pkgs) != 0 {
		t.Errorf("a tree without dpkg: %v, %v", pkgs, err)
	}
}

// The document: SPDX 2.3, the image describing every package, the same bytes for the same
// packages in any order, the counts by kind; and this test binary's own Go modules.
func TestSPDX(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	mods, err := GoModules("sbom.test", self)
	if err != nil {
		t.Fatal(err)
	}
	if len(mods) < 2 || mods[0].Name != "github.com/kilnproject/kiln" || mods[1].Name != "stdlib" || !strings.HasPrefix(mods[1].Version, "go1.") {
		t.Fatalf("Go modules of the test binary: %+v", mods[:min(len(mods), 3)])
	}
	pkgs := append([]Package{
		{Kind: KindImage, Name: "registry.k8s.io/pause:3.10.2", Version: "sha256:ab", PURL: "pkg:oci/pause@sha256%3Aab?repository_url=registry.k8s.io/pause"},
		{Kind: KindArtifact, Name: "crictl", Version: "", Download: "https://example.com/crictl.tar.gz", SHA256: strings.Repeat("c", 64)},
		{Kind: KindKernel, Name: "linux", Version: "6.1.0-57-cloud-amd64"},
		{Kind: KindDeb, Name: "libc6", Version: "2.36", Arch: "amd64", PURL: "pkg:deb/debian/libc6@2.36?arch=amd64"},
	}, mods...)
	d := Document{Name: "qemu-worker", Created: time.Unix(1.7e9, 0), Creator: "kiln-test", Packages: pkgs}
	a, err := d.SPDX()
	if err != nil {
		t.Fatal(err)
	}
	slices.Reverse(d.Packages)
	if b, _ := d.SPDX(); string(a) != string(b) {
		t.Error("the same packages in another order gave other bytes")
	}
	var doc spdxDocument
	if err := json.Unmarshal(a, &doc); err != nil {
		t.Fatal(err)
	}
	if doc.SPDXVersion != "SPDX-2.3" || doc.CreationInfo.Created != "2023-11-14T22:13:20Z" || len(doc.Packages) != len(pkgs)+1 ||
		len(doc.Relationships) != len(pkgs)+1 || !strings.HasPrefix(doc.DocumentNamespace, "https://spdx.kiln.invalid/qemu-worker/") {
		t.Errorf("document: %+v", doc.CreationInfo)
	}
	if p := doc.Packages[1]; p.Name != "libc6" || p.ExternalRefs[0].ReferenceLocator != "pkg:deb/debian/libc6@2.36?arch=amd64" {
		t.Errorf("first package %+v, want the Debian one", p)
	}
	if n := d.Counts(); n[KindDeb] != 1 || n[KindGo] != len(mods) || n[KindImage] != 1 || n[KindArtifact] != 1 || n[KindKernel] != 1 {
		t.Errorf("counts %v", n)
	}
}
