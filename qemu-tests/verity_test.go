package qemutests

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kilnproject/kiln/builder/disk"
	"github.com/kilnproject/kiln/builder/vm"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

// A root whose bytes changed after the bake never runs: one byte of root-a's filesystem is
// flipped, and the boot stops in stage 1 with a console line naming root-a and the root hash,
// before systemd; kiln inspect names the block and exits 1. (Every other boot test mounts its
// root through dm-verity: TestWorkerBootsTwice checks the line that says so.)
func TestVerifiedRootRefusesAChangedByte(t *testing.T) {
	e := newEnv(t)
	baked := e.bake("qemu", "worker")
	var md nodeimage.Metadata
	raw, err := os.ReadFile(strings.TrimSuffix(baked, ".raw") + ".json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &md); err != nil || md.Verity == nil {
		t.Fatalf("%s.json has no verity record (%v)", strings.TrimSuffix(baked, ".raw"), err)
	}
	img := filepath.Join(e.dir, "changed.raw")
	copySparse(t, baked, img)
	res, _, err := disk.Read(img)
	if err != nil {
		t.Fatal(err)
	}
	rootA, _ := res.Partition(nodeimage.RootAName)
	// Byte 1000 of the filesystem: in its first block, which the kernel reads to mount it.
	f, err := os.OpenFile(img, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 1)
	f.ReadAt(b, rootA.Start+1000)
	b[0] ^= 0x80
	if _, err := f.WriteAt(b, rootA.Start+1000); err != nil {
		t.Fatal(err)
	}
	f.Close()

	out, code := kilnCode(e, "inspect", img)
	if code != 1 {
		t.Errorf("kiln inspect of the changed disk: exit %d, want 1", code)
	}
	for _, want := range []string{"verity:  root-a MISMATCH against root hash " + md.Verity.RootHash, "data block 0 (byte 0) does not match the verity tree"} {
		if !strings.Contains(out, want) {
			t.Errorf("kiln inspect of the changed disk lacks %q:\n%s", want, out)
		}
	}

	refused := regexp.MustCompile(`kiln-init: stage 1 failed: .*` + regexp.QuoteMeta(nodeimage.RootAName+" ") + `\S+ does not match its root hash ` + md.Verity.RootHash)
	m, line := e.bootWith(vm.Config{Image: img}, regexp.MustCompile(refused.String()+`|`+firstbootDone.String()), 5*time.Minute)
	if !refused.MatchString(line) {
		t.Fatalf("boot of a changed root: %q, want stage 1 to refuse it\n%s", line, tail(m.Lines(), 30))
	}
	for _, l := range m.Lines() {
		if strings.Contains(l, "systemd[1]") || strings.Contains(l, "Welcome to") {
			t.Fatalf("systemd ran from the changed root: %q", l)
		}
	}
}

// kilnCode runs the test's kiln binary with args in the repository copy and returns its output and
// exit code.
func kilnCode(e *env, args ...string) (string, int) {
	e.t.Helper()
	cmd := exec.Command(e.kiln, args...)
	cmd.Dir, cmd.Env = e.repo, e.environ
	out, err := cmd.CombinedOutput()
	code := 0
	if err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			e.t.Fatalf("kiln %s: %v", strings.Join(args, " "), err)
		}
		code = ee.ExitCode()
	}
	return string(out), code
}
