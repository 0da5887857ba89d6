package install

import (
	"context"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kilnproject/kiln/internal/testkit"
)

// TestInstallBlockDevice: on a real block device (a loop device with partition scanning) over
// an earlier GPT, the installer opens the disk exclusively, writes the image, and the kernel
// re-reads the new partition table, so the image's three partitions replace the old one without
// a reboot. Where the kernel does not scan loop devices' partitions at all, only the write is
// checked.
func TestInstallBlockDevice(t *testing.T) {
	testkit.RequireRoot(t, "attaches a loop device")
	losetup := testkit.Tool(t, "losetup", "mount")
	img := makeImage(t)
	srv := newServer(t)
	srv.files["/img.raw"] = img.raw
	srv.files["/node1.ign"] = []byte(`{"ignition":{"version":"3.4.0"}}`)
	backing := sparseDisk(t, 64*mib)
	testkit.Run(t, testkit.Tool(t, "sgdisk", "gdisk"), "-n", "1:0:+8M", backing)
	out, err := exec.Command(losetup, "--find", "--show", "--partscan", backing).CombinedOutput()
	if err != nil {
		t.Skipf("no loop device: %v: %s", err, out)
	}
	dev := strings.TrimSpace(string(out))
	t.Cleanup(func() { exec.Command(losetup, "-d", dev).Run() })
	partition := func(n int) string {
		return filepath.Join("/sys/block", filepath.Base(dev), filepath.Base(dev)+"p"+strconv.Itoa(n))
	}
	scans := waitFor(partition(1), 2*time.Second)
	o := testOpts(t)
	o.host = host{}
	p := params{dev: dev, imageURL: srv.url(t, "img.raw"), sha256: sha(img.raw), configURL: srv.URL + "/node1.ign", wipe: true}
	if _, err := install(context.Background(), slog.New(slog.NewTextHandler(testWriter{t}, nil)), p, o); err != nil {
		t.Fatal(err)
	}
	assertInstalled(t, backing, img, testOptions+" kiln.config.url="+srv.URL+"/node1.ign")
	if !scans {
		t.Skip("this kernel shows no partitions of loop devices: the re-read is not checked")
	}
	if !waitFor(partition(3), 5*time.Second) {
		t.Errorf("the kernel does not know the installed partitions (no %s)", partition(3))
	}
}

// waitFor reports whether path exists within d.
func waitFor(path string, d time.Duration) bool {
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if _, err := os.Stat(path); err == nil {
			return true
		}
	}
	return false
}

// testWriter logs to the test.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}
