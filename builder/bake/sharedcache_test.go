package bake

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kilnproject/kiln/builder/artifact"
	"github.com/kilnproject/kiln/builder/cacherepo"
	"github.com/kilnproject/kiln/builder/output"
	"github.com/kilnproject/kiln/internal/testkit"
)

// TestBakeSharedCache is two CI runners and a cache repository: runner A, with an empty
// cache, flattens the base, applies the images' layers, compresses the initramfs and pushes
// them; runner B, with another empty cache, pulls them all, makes none of them, and bakes the
// same bytes. A repository that is down is one warning, and a bake like A's.
func TestBakeSharedCache(t *testing.T) {
	r := newK8sRepo(t, "")
	r.lock(t)
	host := testkit.Registry(t)
	bakeIn := func(runner, repo string) (string, string) {
		t.Helper()
		var buf bytes.Buffer
		log := slog.New(slog.NewTextHandler(&buf, nil))
		cr, err := cacherepo.New(repo, nil, log)
		if err != nil {
			t.Fatal(err)
		}
		out := filepath.Join(r.dir, "out-"+runner)
		_, err = Bake(context.Background(), Options{Definition: r.def, Role: "worker", OutDir: out,
			KilnInit: r.init, Stage1: r.init, Cache: artifact.NewCache(filepath.Join(r.dir, "cache-"+runner)),
			Log: log, Version: "test", Created: time.Unix(0, 0), CacheRepo: cr})
		if err != nil {
			t.Fatalf("runner %s: %v\n%s", runner, err, buf.String())
		}
		sum, _, err := output.HashFile(filepath.Join(out, "test-worker.raw"))
		if err != nil {
			t.Fatal(err)
		}
		return sum, buf.String()
	}
	count := func(log, s string) int { return strings.Count(log, s) }

	a, alog := bakeIn("a", host+"/kiln-cache")
	// The base, the two images' applied layers, the initramfs.
	if count(alog, "cache entry pushed") != 4 || count(alog, "cache entry pulled") != 0 || count(alog, "level=WARN") != 0 {
		t.Fatalf("runner A did not push 4 entries:\n%s", alog)
	}
	for _, kind := range []string{":base-trees-", ":trees-", ":initramfs-"} {
		if !strings.Contains(alog, kind) {
			t.Errorf("runner A pushed no %s entry", kind)
		}
	}

	b, blog := bakeIn("b", host+"/kiln-cache")
	if count(blog, "cache entry pulled") != 4 || count(blog, "cache entry pushed") != 0 || count(blog, "level=WARN") != 0 {
		t.Errorf("runner B did not pull the 4 entries (and push none):\n%s", blog)
	}
	if strings.Contains(blog, `msg="base flattened"`) || !strings.Contains(blog, `msg="base tree linked from the cache"`) {
		t.Errorf("runner B flattened the base:\n%s", blog)
	}
	if a != b {
		t.Errorf("runner B's raw is %s, runner A's %s: same inputs, other bytes", b, a)
	}

	c, clog := bakeIn("c", fmt.Sprintf("127.0.0.1:%d/kiln-cache", testkit.FreePort(t)))
	if count(clog, "level=WARN") != 1 || count(clog, "cache repository not used from here on") != 1 {
		t.Errorf("a repository that is down: want one warning:\n%s", clog)
	}
	if c != a {
		t.Errorf("the bake beside a repository that is down is %s, runner A's %s", c, a)
	}
}
