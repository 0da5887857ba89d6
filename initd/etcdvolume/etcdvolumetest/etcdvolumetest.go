// Package etcdvolumetest is what the tests of etcd volume finders share, in package
// etcdvolume and in the clouds' packages (initd/cloud/...): a udev-like /dev tree of the
// test's own, and real loop-device disks. It is for tests only.
package etcdvolumetest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kilnproject/kiln/internal/testkit"
)

// Dev is a udev-like tree: device nodes (empty files) in Devs and relative links to
// them in ByID (Devs/disk/by-id), as udev makes them.
type Dev struct {
	t          *testing.T
	Devs, ByID string
}

// NewDev makes an empty Dev in a directory of t's.
func NewDev(t *testing.T) *Dev {
	root := t.TempDir()
	f := &Dev{t: t, Devs: filepath.Join(root, "dev"), ByID: filepath.Join(root, "dev/disk/by-id")}
	if err := os.MkdirAll(f.ByID, 0o755); err != nil {
		t.Fatal(err)
	}
	return f
}

// Link makes by-id/<name> -> ../../<dev>, creating the device node, and returns the node.
func (f *Dev) Link(name, dev string) string {
	f.t.Helper()
	node, err := f.Plug(name, dev)
	if err != nil {
		f.t.Fatal(err)
	}
	return node
}

// Plug is Link for a fake's own goroutine: it returns what fails instead of failing the
// test.
func (f *Dev) Plug(name, dev string) (string, error) {
	node := filepath.Join(f.Devs, dev)
	if err := os.WriteFile(node, nil, 0o600); err != nil {
		return "", fmt.Errorf("plug %s: %w", name, err)
	}
	if err := os.Symlink(filepath.Join("../..", dev), filepath.Join(f.ByID, name)); err != nil {
		return "", fmt.Errorf("plug %s: %w", name, err)
	}
	return node, nil
}

// NeedTools skips the test unless it runs as root, with loop devices and the tools it
// needs.
func NeedTools(t *testing.T, tools ...string) {
	t.Helper()
	testkit.RequireRoot(t, "loop devices")
	testkit.Tools(t, tools...)
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skipf("no loop devices: %v", err)
	}
}

// ShTrim runs a command like sh and returns its output without the trailing newline.
func ShTrim(t *testing.T, name string, args ...string) string {
	t.Helper()
	return strings.TrimSpace(testkit.Run(t, name, args...))
}

// LoopDisk attaches a 64 MiB sparse image as a loop device, with one GPT partition
// filling it when partitioned, and returns the disk's device node.
func LoopDisk(t *testing.T, partitioned bool) string {
	t.Helper()
	img := testkit.SparseFile(t, 64<<20)
	if partitioned {
		ShTrim(t, "sgdisk", "-n", "1:0:0", img)
	}
	dev := ShTrim(t, "losetup", "--find", "--show", "--partscan", img)
	t.Cleanup(func() { exec.Command("losetup", "-d", dev).Run() })
	if partitioned {
		if _, err := os.Stat(dev + "p1"); err != nil {
			// Without udev the kernel's partition scan may not have run; ask for it.
			exec.Command("partx", "-a", dev).Run()
		}
		if _, err := os.Stat(dev + "p1"); err != nil {
			t.Fatalf("partition of %s: %v", dev, err)
		}
	}
	return dev
}
