package firstboot

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kilnproject/kiln/initd/config"
	"github.com/kilnproject/kiln/internal/testkit"
)

func storagePlan(t *testing.T, ign, imageRole string) *plan {
	t.Helper()
	cfg, err := config.Parse([]byte(`{"ignition":{"version":"3.5.0"},` + ign + `}`))
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return newPlan(Options{Root: t.TempDir(), Log: slog.New(slog.DiscardHandler)}, cfg, imageRole)
}

// A swap area is refused before anything is touched on a node that runs kubelet: by the
// image's role, or by the role of the node.yaml the config writes.
func TestStorageRefusesSwapForKubelet(t *testing.T) {
	swap := `"storage":{"filesystems":[{"device":"/dev/kiln-test-absent","format":"swap"}]`
	nodeYAML := "cluster:\n  name: prod\nrole: worker\napiEndpoint: api.example.com:6443\n"
	for _, tc := range []struct{ name, ign, role, want string }{
		{"image role", swap + `}`, "worker", "storage.filesystems[0].format: swap is refused on this worker node: kubelet runs there"},
		{"node.yaml in the config", swap + `,"files":[{"path":"/etc/kiln/node.yaml","contents":{"source":"data:,` + strings.ReplaceAll(strings.ReplaceAll(nodeYAML, "\n", "%0A"), " ", "%20") + `"}}]}`, "",
			"storage.filesystems[0].format: swap is refused on this worker node"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := storagePlan(t, tc.ign, tc.role)
			changed, err := p.applyStorage(context.Background())
			if err == nil || !strings.Contains(err.Error(), tc.want) || changed {
				t.Fatalf("applyStorage = %v, %v; want unchanged and %q", changed, err, tc.want)
			}
			if _, err := os.Stat(filepath.Join(p.opts.Root, "etc/systemd/system")); err == nil {
				t.Errorf("a refused storage section wrote units")
			}
		})
	}
}

// The etcd volume found on a disk the config's storage uses is refused, naming both.
func TestEtcdVolumeSharesNoDiskWithStorage(t *testing.T) {
	testkit.RequireRoot(t, "loop devices")
	testkit.Tool(t, "losetup", "mount")
	testkit.Tool(t, "sgdisk", "gdisk")
	img := filepath.Join(t.TempDir(), "disk.img")
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, 64<<20); err != nil {
		t.Fatal(err)
	}
	dev := strings.TrimSpace(testkit.Run(t, "losetup", "--find", "--show", "--partscan", img))
	t.Cleanup(func() { testkit.Run(t, "losetup", "-d", dev) })
	testkit.Run(t, "sgdisk", "--new=1:0:+8M", dev)
	testkit.Run(t, "partx", "-u", dev)
	p := storagePlan(t, `"storage":{"filesystems":[{"device":"/dev/kiln-test-absent","format":"ext4"},{"device":"`+dev+`p1","format":"ext4"}]}`, "control-plane")
	err := p.storageOnDisk(dev)
	want := "etcd volume " + dev + ": storage.filesystems[1].device (" + dev + "p1) is on the same disk " + filepath.Base(dev)
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("storageOnDisk = %v, want %q", err, want)
	}
	other := storagePlan(t, `"storage":{"filesystems":[{"device":"/dev/kiln-test-absent","format":"ext4"}]}`, "control-plane")
	if err := other.storageOnDisk(dev); err != nil {
		t.Errorf("storageOnDisk with no shared disk = %v", err)
	}
}

// A mount path that leads, through the image's own links, into a tree no filesystem may be
// mounted on is refused before anything is touched: here /srv/data is a link into the
// read-only /usr.
func TestStorageRefusesMountThroughLink(t *testing.T) {
	p := storagePlan(t, `"storage":{"filesystems":[{"device":"/dev/kiln-test-absent","format":"ext4","path":"/srv/data"}]}`, "worker")
	if err := os.MkdirAll(filepath.Join(p.opts.Root, "srv"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/usr/share/data", filepath.Join(p.opts.Root, "srv/data")); err != nil {
		t.Fatal(err)
	}
	changed, err := p.applyStorage(context.Background())
	want := "storage.filesystems[0].path: /srv/data leads to /usr/share/data"
	if err == nil || !strings.Contains(err.Error(), want) || changed {
		t.Fatalf("applyStorage = %v, %v; want unchanged and %q", changed, err, want)
	}
	if _, err := os.Stat(filepath.Join(p.opts.Root, "etc/systemd/system")); err == nil {
		t.Errorf("a refused storage section wrote units")
	}
}
