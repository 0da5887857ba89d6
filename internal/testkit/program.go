package testkit

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// rootFSEnv names the environment variable that points the boot tests at an extracted
// base OS tree (with a kernel and its modules).
const rootFSEnv = "KILN_TEST_ROOTFS"

// RootFS returns the base OS tree named by $KILN_TEST_ROOTFS and the version of the kernel
// in it; it skips the test when the variable is not set.
func RootFS(t testing.TB) (root, kver string) {
	t.Helper()
	root = os.Getenv(rootFSEnv)
	if root == "" {
		t.Skip(rootFSEnv + " not set")
	}
	deps, _ := filepath.Glob(filepath.Join(root, "usr/lib/modules/*/modules.dep"))
	if len(deps) == 0 {
		t.Fatalf("no usr/lib/modules/*/modules.dep under %s", root)
	}
	return root, filepath.Base(filepath.Dir(deps[0]))
}

// GoProgram builds the Go main package src as a static binary and returns its path: the
// init a boot test puts in an initramfs.
func GoProgram(t testing.TB, src string) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range map[string]string{"go.mod": "module testinit\n\ngo 1.22\n", "main.go": src} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out := filepath.Join(dir, "init")
	cmd := exec.Command("go", "build", "-trimpath", "-o", out, ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-buildvcs=false")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v\n%s", out, err, b)
	}
	return out
}
