package qemutests

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// layoutTags lists the tags (org.opencontainers.image.ref.name) of the OCI layout in dir.
func layoutTags(dir string) []string {
	var index struct {
		Manifests []struct {
			Annotations map[string]string `json:"annotations"`
		} `json:"manifests"`
	}
	b, err := os.ReadFile(filepath.Join(dir, "index.json"))
	if err != nil || json.Unmarshal(b, &index) != nil {
		return nil
	}
	var tags []string
	for _, m := range index.Manifests {
		tags = append(tags, m.Annotations["org.opencontainers.image.ref.name"])
	}
	return tags
}

// make bench's first-boot comparison bakes two images from the cloud-init base
// (make base-cloudinit), as bench/bench.sh does: both must bake. cloud-init's Python sources
// and .pyc files hold example key headers, which the bake's secret guard must not take for
// keys.
func TestBenchImagesBake(t *testing.T) {
	e := newRepoEnv(t)
	var cache string // the environment's last KILN_CACHE, the one kiln sees
	for _, kv := range e.environ {
		if v, ok := strings.CutPrefix(kv, "KILN_CACHE="); ok {
			cache = v
		}
	}
	require(t, slices.Contains(layoutTags(filepath.Join(cache, "base")), "bookworm-cloudinit"),
		"no cloud-init base (tag bookworm-cloudinit) in %s/base: make base-cloudinit", cache)
	root := repoRoot(t)
	e.run(root, "cp", "-a", filepath.Join(root, "bench"), filepath.Join(e.repo, "bench"))
	out := filepath.Join(e.dir, "out")
	for _, def := range []string{"kiln", "cloudinit"} {
		start := time.Now()
		e.run(e.repo, e.kiln, "lock", "--update", "bench/"+def+".yaml")
		e.run(e.repo, e.kiln, "bake", "bench/"+def+".yaml", "--role", "worker", "-o", out)
		img := filepath.Join(out, "bench-"+def+"-worker.raw")
		if fi, err := os.Stat(img); err != nil || fi.Size() == 0 {
			t.Fatalf("bench/%s.yaml baked no image %s: %v", def, img, err)
		}
		t.Logf("baked bench/%s.yaml from the cloud-init base in %s", def, time.Since(start).Round(time.Millisecond))
	}
}
