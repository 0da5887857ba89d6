package main

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kilnproject/kiln/builder/provenance"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

// signedOutputs writes a bake's outputs (a raw, the SBOM, the metadata naming it) and their
// provenance signed with key into a directory, and returns it.
func signedOutputs(t *testing.T, key ed25519.PrivateKey, sbomInMetadata string) string {
	return signedOutputsCDX(t, key, sbomInMetadata, "")
}

// signedOutputsCDX is signedOutputs with a CycloneDX SBOM too when cdxInMetadata is not "":
// qemu-worker.cdx.json is signed, and the metadata names it with cdxInMetadata's digest.
func signedOutputsCDX(t *testing.T, key ed25519.PrivateKey, sbomInMetadata, cdxInMetadata string) string {
	t.Helper()
	dir := t.TempDir()
	files := map[string]string{"qemu-worker.raw": "disk", "qemu-worker.spdx.json": `{"spdxVersion":"SPDX-2.3"}`, "qemu-worker.cdx.json": `{"bomFormat":"CycloneDX"}`}
	names := []string{"qemu-worker.raw", "qemu-worker.spdx.json"}
	info := &nodeimage.SBOMInfo{File: "qemu-worker.spdx.json", SHA256: hexOf(sbomInMetadata)}
	if cdxInMetadata != "" {
		names = append(names, "qemu-worker.cdx.json")
		info.CycloneDX = &nodeimage.FileDigest{File: "qemu-worker.cdx.json", SHA256: hexOf(cdxInMetadata)}
	}
	var subjects []provenance.Subject
	for _, name := range names {
		os.WriteFile(filepath.Join(dir, name), []byte(files[name]), 0o644)
		subjects = append(subjects, provenance.Subject{Name: name, Digest: provenance.SHA256(hexOf(files[name]))})
	}
	md, _ := json.Marshal(nodeimage.Metadata{Name: "qemu", Role: "worker", SBOM: info})
	os.WriteFile(filepath.Join(dir, "qemu-worker.json"), md, 0o644)
	subjects = append(subjects, provenance.Subject{Name: "qemu-worker.json", Digest: provenance.SHA256(hexOf(string(md)))})
	env, err := provenance.Sign(provenance.NewStatement(subjects, nil, nil, "test"), key)
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "qemu-worker"+provenance.EnvelopeSuffix), env, 0o644)
	return dir
}

func hexOf(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

func TestVerifyOutputs(t *testing.T) {
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	_, other, _ := ed25519.GenerateKey(rand.Reader)
	pub := key.Public()
	sbom := `{"spdxVersion":"SPDX-2.3"}`

	dir := signedOutputs(t, key, sbom)
	var out bytes.Buffer
	if err := verifyOutputs(&out, dir, pub); err != nil {
		t.Fatalf("verify: %v\n%s", err, out.String())
	}
	for _, want := range []string{"signature ok", "qemu-worker.raw: sha256 ok", "qemu-worker.spdx.json: the signed SBOM", "3 subjects verified"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	out.Reset()
	if err := verifyOutputs(&out, signedOutputsCDX(t, key, sbom, `{"bomFormat":"CycloneDX"}`), pub); err != nil || !strings.Contains(out.String(), "qemu-worker.cdx.json: the signed SBOM") {
		t.Errorf("verify with a CycloneDX SBOM: %v\n%s", err, out.String())
	}
	if err := verifyOutputs(&out, filepath.Join(dir, "qemu-worker.json"), pub); err != nil {
		t.Errorf("verify of the metadata file: %v", err)
	}

	for _, tc := range []struct {
		name  string
		setup func() string
		want  string
	}{
		{"another key", func() string { return signedOutputs(t, other, sbom) }, "no signature verifies with the key"},
		{"a changed output", func() string {
			d := signedOutputs(t, key, sbom)
			os.WriteFile(filepath.Join(d, "qemu-worker.raw"), []byte("disc"), 0o644)
			return d
		}, "qemu-worker.raw: sha256 "},
		{"a missing output", func() string {
			d := signedOutputs(t, key, sbom)
			os.Remove(filepath.Join(d, "qemu-worker.raw"))
			return d
		}, "qemu-worker.raw: open"},
		{"the metadata names another SBOM", func() string { return signedOutputs(t, key, `{"other":1}`) }, "is not the signed one"},
		{"the metadata names another CycloneDX SBOM", func() string { return signedOutputsCDX(t, key, sbom, `{"other":1}`) },
			"the SBOM qemu-worker.cdx.json (sha256 "},
		{"no provenance", func() string { return t.TempDir() }, "no *.intoto.jsonl"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			err := verifyOutputs(&out, tc.setup(), pub)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("verify: %v, want an error saying %q", err, tc.want)
			}
		})
	}
}
