package qemutests

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kilnproject/kiln/internal/nodeimage"
	"github.com/kilnproject/kiln/internal/testkit"
)

// The default worker's SBOM and signed provenance, read beside the bake: its Debian packages
// are those dpkg-query lists in the image's own root filesystem (names, versions,
// architectures), it lists every artifact and pre-pulled image the metadata records and
// kiln-init's Go modules, and kiln inspect names it with its counts; kiln verify checks the
// bake's provenance (signed with --sign-key) and names the SBOM once a byte of it changed.
// No VM is booted.
func TestSBOMOfTheWorker(t *testing.T) {
	e := newEnv(t)
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	der, _ := x509.MarshalPKCS8PrivateKey(key)
	pubDER, _ := x509.MarshalPKIXPublicKey(key.Public())
	keyFile, pubFile := filepath.Join(e.dir, "kiln.key"), filepath.Join(e.dir, "kiln.pub")
	os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600)
	os.WriteFile(pubFile, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER}), 0o644)
	raw := e.bakeInto("qemu", "worker", "out", "qemu", "", "--sign-key", keyFile)
	var md nodeimage.Metadata
	if err := json.Unmarshal([]byte(testkit.ReadFile(t, strings.TrimSuffix(raw, ".raw")+".json")), &md); err != nil {
		t.Fatal(err)
	}
	if md.SBOM == nil {
		t.Fatal("the metadata names no SBOM")
	}
	var doc struct {
		SPDXVersion string `json:"spdxVersion"`
		Packages    []struct {
			Name         string `json:"name"`
			SPDXID       string `json:"SPDXID"`
			VersionInfo  string `json:"versionInfo"`
			Comment      string `json:"comment"`
			ExternalRefs []struct {
				ReferenceLocator string `json:"referenceLocator"`
			} `json:"externalRefs"`
		} `json:"packages"`
	}
	sbomFile := filepath.Join(filepath.Dir(raw), md.SBOM.File)
	if err := json.Unmarshal([]byte(testkit.ReadFile(t, sbomFile)), &doc); err != nil {
		t.Fatal(err)
	}
	var debs []string
	kinds := map[string]int{}
	kilnInit := false
	for _, p := range doc.Packages[1:] {
		kind := strings.Split(strings.TrimPrefix(p.SPDXID, "SPDXRef-"), "-")[0]
		kinds[kind]++
		if kind == "deb" {
			arch := p.ExternalRefs[0].ReferenceLocator
			arch = arch[strings.Index(arch, "arch=")+5:]
			arch, _, _ = strings.Cut(arch, "&")
			debs = append(debs, p.Name+" "+p.VersionInfo+" "+arch)
		}
		if kind == "go" && p.Name == "github.com/kilnproject/kiln" && p.Comment == "built into kiln-init" {
			kilnInit = true
		}
	}

	// dpkg-query on the image's own root.
	dir := t.TempDir()
	part, err := extractPartition(raw, nodeimage.RootAName, dir)
	if err != nil {
		t.Fatal(err)
	}
	tree := filepath.Join(dir, "tree")
	// kiln's base keeps dpkg's database in /usr/lib/kiln/dpkg, /var/lib/dpkg a link to it.
	if out, err := exec.Command("unsquashfs", "-q", "-n", "-d", tree, part, "var/lib/dpkg", "usr/lib/kiln/dpkg").CombinedOutput(); err != nil {
		t.Fatalf("unsquashfs: %v\n%s", err, out)
	}
	out, err := exec.Command("dpkg-query", "--admindir="+filepath.Join(tree, "var/lib/dpkg"), "-W", "-f", `${db:Status-Abbrev}\t${Package}\t${Version}\t${Architecture}\n`).Output()
	if err != nil {
		t.Fatalf("dpkg-query: %v", err)
	}
	var want []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if f := strings.Split(line, "\t"); len(f) == 4 && len(f[0]) >= 2 && f[0][1] == 'i' {
			want = append(want, f[1]+" "+f[2]+" "+f[3])
		}
	}
	slices.Sort(debs)
	slices.Sort(want)
	if doc.SPDXVersion != "SPDX-2.3" || len(want) < 100 || !slices.Equal(debs, want) {
		t.Errorf("SBOM lists %d Debian packages, dpkg-query %d in the image's root", len(debs), len(want))
	}
	images := 0
	if md.Kubernetes != nil {
		images = len(md.Kubernetes.Images)
	}
	if kinds["artifact"] != len(md.Artifacts) || kinds["image"] != images || kinds["kernel"] != 1 || !kilnInit {
		t.Errorf("SBOM kinds %v (kiln-init's module listed: %v), want %d artifacts, %d images, the kernel", kinds, kilnInit, len(md.Artifacts), images)
	}
	for k, n := range kinds {
		if md.SBOM.Packages[k] != n {
			t.Errorf("metadata counts %v, the document %v", md.SBOM.Packages, kinds)
			break
		}
	}
	// The CycloneDX document lists the same packages (SPDX adds the image as a package).
	if c := md.SBOM.CycloneDX; c == nil {
		t.Error("the metadata names no CycloneDX SBOM")
	} else {
		var cdx struct {
			SpecVersion string            `json:"specVersion"`
			Components  []json.RawMessage `json:"components"`
		}
		if err := json.Unmarshal([]byte(testkit.ReadFile(t, filepath.Join(filepath.Dir(raw), c.File))), &cdx); err != nil {
			t.Fatal(err)
		}
		if cdx.SpecVersion != "1.6" || len(cdx.Components) != len(doc.Packages)-1 {
			t.Errorf("CycloneDX %s lists %d components, SPDX %d packages besides the image", cdx.SpecVersion, len(cdx.Components), len(doc.Packages)-1)
		}
	}
	inspect := e.run(e.repo, e.kiln, "inspect", strings.TrimSuffix(raw, ".raw")+".json")
	if !strings.Contains(inspect, "sbom:    "+md.SBOM.File+" (sha256 "+md.SBOM.SHA256+"): ") {
		t.Errorf("kiln inspect does not name the SBOM:\n%s", inspect)
	}
	t.Logf("SBOM of the worker: %v", md.SBOM.Packages)

	outDir := filepath.Dir(raw)
	verified := e.run(e.repo, e.kiln, "verify", outDir, "--key", pubFile)
	if !strings.Contains(verified, md.SBOM.File+": the signed SBOM") || !strings.Contains(verified, "qemu-worker.cdx.json: the signed SBOM") ||
		!strings.Contains(verified, "qemu-worker.raw: sha256 ok") {
		t.Errorf("kiln verify:\n%s", verified)
	}
	// One byte of the SBOM changed: kiln verify fails and names it.
	b := []byte(testkit.ReadFile(t, sbomFile))
	b[len(b)-3] ^= 1
	if err := os.WriteFile(sbomFile, b, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(e.kiln, "verify", outDir, "--key", pubFile)
	cmd.Env = e.environ
	failed, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(failed), md.SBOM.File+": sha256 ") {
		t.Errorf("kiln verify after the SBOM changed: %v\n%s", err, failed)
	}
}
