package main

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kilnproject/kiln/builder/provenance"
	"github.com/kilnproject/kiln/builder/publish/aws"
	"github.com/kilnproject/kiln/builder/publish/gce"
)

// signOutput signs the provenance of the bake output at path as kiln bake --sign-key does for
// it and its metadata, and returns the envelope's hex sha256.
func signOutput(t *testing.T, path string, key ed25519.PrivateKey) string {
	t.Helper()
	dir := filepath.Dir(path)
	stem := strings.TrimSuffix(strings.TrimSuffix(filepath.Base(path), ".raw"), ".tar.gz")
	var subjects []provenance.Subject
	for _, name := range []string{filepath.Base(path), stem + ".json"} {
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(data)
		subjects = append(subjects, provenance.Subject{Name: name, Digest: provenance.SHA256(hex.EncodeToString(sum[:]))})
	}
	env, err := provenance.Sign(provenance.NewStatement(subjects, nil, nil, "test"), key)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, stem+provenance.EnvelopeSuffix), env, 0o644); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(env)
	return hex.EncodeToString(sum[:])
}

// writePublicKey writes key's public half as a PEM file, as openssl pkey -pubout does.
func writePublicKey(t *testing.T, key ed25519.PrivateKey) string {
	t.Helper()
	der, err := x509.MarshalPKIXPublicKey(key.Public())
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "release.pub")
	if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// With --key, kiln publish refuses, before any request, an image whose provenance is missing,
// signed by another key or no longer matches its metadata, naming what failed; an image that
// verifies is published with the provenance's digest recorded on what was made.
func TestPublishKey(t *testing.T) {
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	_, other, _ := ed25519.GenerateKey(rand.Reader)
	pub := writePublicKey(t, key)
	t.Setenv("KILN_VERIFY_KEY", "")

	refusals := []struct {
		name  string
		setup func(t *testing.T, path string)
		want  string
	}{
		{"no provenance", func(t *testing.T, path string) {}, "no signed provenance beside it"},
		{"another key", func(t *testing.T, path string) { signOutput(t, path, other) }, "no signature verifies with the key"},
		{"metadata changed after signing", func(t *testing.T, path string) {
			signOutput(t, path, key)
			md := strings.TrimSuffix(strings.TrimSuffix(path, ".raw"), ".tar.gz") + ".json"
			data, _ := os.ReadFile(md)
			os.WriteFile(md, append(data, '\n'), 0o644)
		}, "the metadata changed since it was signed"},
	}

	t.Run("aws", func(t *testing.T) {
		for _, tc := range refusals {
			t.Run(tc.name, func(t *testing.T) {
				f := awsEnv(t)
				raw, _ := awsRaw(t)
				tc.setup(t, raw)
				_, errs, code := runCLI(t, "publish", "aws", raw, "--region", "eu-west-1", "--name", "kiln-aws-worker",
					"--endpoint-url", f.URL(), "--key", pub)
				if code == 0 || !strings.Contains(errs, tc.want) || !strings.Contains(errs, "refusing an image whose provenance does not verify") {
					t.Errorf("exit %d, stderr %q: want a refusal naming %q", code, errs, tc.want)
				}
				if n := f.AllCalls(); n != 0 {
					t.Errorf("%d requests reached AWS before the refusal", n)
				}
			})
		}
		t.Run("verified", func(t *testing.T) {
			f := awsEnv(t)
			raw, content := awsRaw(t)
			prov := signOutput(t, raw, key)
			t.Setenv("KILN_VERIFY_KEY", pub) // the environment gives the key as --key does
			var res aws.Result
			kilnJSON(t, &res, "publish", "aws", raw, "--region", "eu-west-1", "--name", "kiln-aws-worker",
				"--endpoint-url", f.URL(), "-o", "json")
			if res.Provenance != prov {
				t.Errorf("-o json provenance %q, want the envelope's sha256 %s", res.Provenance, prov)
			}
			if err := f.SnapshotMatches("eu-west-1", res.SnapshotID, content); err != nil {
				t.Error(err)
			}
			if got := f.Image("eu-west-1", res.ImageID).Tags[aws.ProvenanceTag]; got != prov {
				t.Errorf("AMI tag %s = %q, want %s", aws.ProvenanceTag, got, prov)
			}
			if got := f.Snapshot("eu-west-1", res.SnapshotID).Tags[aws.ProvenanceTag]; got != prov {
				t.Errorf("snapshot tag %s = %q, want %s", aws.ProvenanceTag, got, prov)
			}
		})
		t.Run("own tag refused", func(t *testing.T) {
			f := awsEnv(t)
			raw, _ := awsRaw(t)
			_, errs, code := runCLI(t, "publish", "aws", raw, "--region", "eu-west-1", "--name", "kiln-aws-worker",
				"--endpoint-url", f.URL(), "--tag", aws.ProvenanceTag+"=x")
			if code != 2 || !strings.Contains(errs, "kiln's own tag") {
				t.Errorf("exit %d, stderr %q: want a usage error", code, errs)
			}
		})
	})

	t.Run("gce", func(t *testing.T) {
		for _, tc := range refusals {
			t.Run(tc.name, func(t *testing.T) {
				gcs, compute := gceFakes(t)
				tgz := gceTarball(t)
				tc.setup(t, tgz)
				_, errs, code := runCLI(t, "publish", "gce", tgz, "--project", "kiln-test", "--bucket", "kiln-images", "--name", "kiln-worker-1",
					"--storage-endpoint", gcs.URL(), "--compute-endpoint", compute.URL(), "--no-auth", "--key", pub)
				if code == 0 || !strings.Contains(errs, tc.want) {
					t.Errorf("exit %d, stderr %q: want a refusal naming %q", code, errs, tc.want)
				}
				if starts, _, _ := gcs.Uploads(); starts != 0 || compute.Image("kiln-worker-1") != nil {
					t.Errorf("%d uploads started, image %v: want nothing sent", starts, compute.Image("kiln-worker-1"))
				}
			})
		}
		t.Run("verified", func(t *testing.T) {
			gcs, compute := gceFakes(t)
			tgz := gceTarball(t)
			prov := signOutput(t, tgz, key)
			var res gce.Result
			kilnJSON(t, &res, "publish", "gce", tgz, "--project", "kiln-test", "--bucket", "kiln-images", "--name", "kiln-worker-1",
				"--storage-endpoint", gcs.URL(), "--compute-endpoint", compute.URL(), "--no-auth", "--key", pub, "-o", "json")
			im := compute.Image("kiln-worker-1")
			if res.Provenance != prov || im == nil {
				t.Fatalf("-o json %+v, want provenance %s and an image", res, prov)
			}
			if im.Labels[gce.ProvenanceLabel] != prov[:63] || !strings.Contains(im.Description, "provenance sha256:"+prov) {
				t.Errorf("image label %s=%q, description %q: want the provenance's digest", gce.ProvenanceLabel, im.Labels[gce.ProvenanceLabel], im.Description)
			}
			// Published again, the image is found by the file's digest as before the key.
			var again gce.Result
			kilnJSON(t, &again, "publish", "gce", tgz, "--project", "kiln-test", "--bucket", "kiln-images", "--name", "kiln-worker-1",
				"--storage-endpoint", gcs.URL(), "--compute-endpoint", compute.URL(), "--no-auth", "--key", pub, "-o", "json")
			if !again.Reused || again.Provenance != prov {
				t.Errorf("second publish %+v: want the image reused, provenance %s", again, prov)
			}
		})
	})
}
