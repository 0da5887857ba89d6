package netboot

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kilnproject/kiln/builder/netboot/netboottest"
	"github.com/kilnproject/kiln/builder/provenance"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

// signImage signs image name of dir as kiln bake --sign-key does: every output and the
// metadata are subjects.
func signImage(t *testing.T, dir, name string, key ed25519.PrivateKey) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, name+".json"))
	if err != nil {
		t.Fatal(err)
	}
	var md nodeimage.Metadata
	if err := json.Unmarshal(data, &md); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	subjects := []provenance.Subject{{Name: name + ".json", Digest: provenance.SHA256(hex.EncodeToString(sum[:]))}}
	for _, o := range md.Outputs {
		subjects = append(subjects, provenance.Subject{Name: o.File, Digest: provenance.SHA256(o.SHA256)})
	}
	env, err := provenance.Sign(provenance.NewStatement(subjects, nil, nil, "test"), key)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, name+provenance.EnvelopeSuffix), string(env))
}

// With a key, Load serves only images whose signed provenance verifies and names the metadata
// as it is, and no install image outside the bake's outputs; each refusal names the image.
func TestLoadVerifiesProvenance(t *testing.T) {
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	_, other, _ := ed25519.GenerateKey(rand.Reader)
	pub := key.Public()
	signed := func(t *testing.T) string {
		dir := fixture(t)
		signImage(t, dir, "metal-worker", key)
		signImage(t, dir, "metal-control-plane", key)
		return dir
	}

	dir := signed(t)
	_, logs := startServer(t, Options{Dir: dir, VerifyKey: pub})
	logged(t, logs, "provenance verified", "image=metal-worker", "image=metal-control-plane")

	for _, tc := range []struct {
		name string
		edit func(t *testing.T, dir string)
		want string
	}{
		{"unsigned", func(t *testing.T, dir string) {
			os.Remove(filepath.Join(dir, "metal-control-plane"+provenance.EnvelopeSuffix))
		}, "image metal-control-plane: refusing to serve an image whose provenance does not verify: "},
		{"another key", func(t *testing.T, dir string) { signImage(t, dir, "metal-worker", other) }, "no signature verifies with the key"},
		{"metadata edited", func(t *testing.T, dir string) {
			p := filepath.Join(dir, "metal-worker.json")
			data, _ := os.ReadFile(p)
			writeFile(t, p, strings.Replace(string(data), netboottest.KernelArgs, netboottest.KernelArgs+" init=/bin/sh", 1))
		}, "metal-worker.json: sha256 "},
		{"install image outside the outputs", func(t *testing.T, dir string) {
			yaml := strings.Replace(machinesYAML, "install: {dev: auto, wipe: true}", "install: {dev: auto, wipe: true, image: metal-control-plane.raw.zst}", 1)
			writeFile(t, filepath.Join(dir, "machines.yaml"), yaml)
			writeFile(t, filepath.Join(dir, "metal-control-plane.raw.zst"), "pretend zstd")
			writeFile(t, filepath.Join(dir, "metal-control-plane.raw.zst.sha256"), sha256Hex("pretend zstd")+"  metal-control-plane.raw.zst\n")
		}, "so no signed provenance covers it"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := signed(t)
			tc.edit(t, dir)
			if _, err := Load(Options{Dir: dir}); err != nil {
				t.Fatalf("without a key the directory loads: %v", err)
			}
			_, err := Load(Options{Dir: dir, VerifyKey: pub})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Load with a key = %v, want an error with %q", err, tc.want)
			}
		})
	}
}
