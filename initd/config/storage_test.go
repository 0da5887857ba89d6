package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/coreos/ignition/v2/config/v3_6/types"
)

// filesystemConfig is a config with one filesystem on device, mounted at path.
func filesystemConfig(t *testing.T, device, path string) *Config {
	t.Helper()
	cfg, err := Parse([]byte(`{"ignition":{"version":"3.5.0"},"storage":{"filesystems":[{"device":"` + device +
		`","format":"ext4","path":"` + path + `"}]}}`))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return cfg
}

// TestMountPathsRefused: a filesystem is never mounted over the kernel's filesystems, the
// image's read-only trees (with /bin, /lib… as links into /usr or not) or /var/run, which is
// /run; below the writable trees it is.
func TestMountPathsRefused(t *testing.T) {
	tests := []struct {
		path string
		want string // "" when accepted
	}{
		{"/proc/sys", "/proc/sys is in /proc, the kernel's process filesystem"},
		{"/sys/fs/cgroup", "/sys/fs/cgroup is in /sys, the kernel's sysfs"},
		{"/dev/shm", "/dev/shm is in /dev, the kernel's device filesystem"},
		{"/dev", "/dev is the kernel's device filesystem"},
		{"/var/run", "/var/run is one of the node's own filesystems"},
		{"/lib/modules", "/lib/modules is in /lib, the image's read-only root"},
		{"/bin", "/bin is the image's read-only root"},
		{"/sbin/x", "/sbin/x is in /sbin, the image's read-only root"},
		{"/lib64", "/lib64 is the image's read-only root"},
		{"/usr/share", "/usr/share is in /usr, the image's read-only root"},
		{"/boot/efi", "/boot/efi is in /boot, the image's boot files"},
		{"/opt", "/opt is one of the node's own filesystems"},
		{"/usr/local", "/usr/local is one of the node's own filesystems"},
		{"/usr/local/data", "/usr/local/data is in /usr, the image's read-only root"},
		{"/etc", "/etc is one of the node's own filesystems"},
		{"/var/lib/kiln/etc", "/var/lib/kiln/etc is in /var/lib/kiln, kiln's own state"},
		{"/opt/data", ""},
		{"/etc/data", ""},
		{"/var/lib/kilnx", ""},
		{"/var", "/var is one of the node's own filesystems"},
		{"/var/lib/etcd", ""},
		{"/var/lib/containerd", ""},
		{"/srv/data", ""},
		{"/home/data", ""},
		{"/opt/data", ""},
		{"/run/media", ""},
		{"/library", ""},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			err := filesystemConfig(t, "/dev/vdb", tt.path).Validate()
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("Validate: %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), "storage.filesystems[0].path: "+tt.want)):
				t.Fatalf("Validate = %v, want storage.filesystems[0].path: %s", err, tt.want)
			}
		})
	}
}

// TestDevicesRefused: a storage device is a block device under /dev: names that never are
// (the process's own files, terminals, memory) are refused wherever a device is named.
func TestDevicesRefused(t *testing.T) {
	tests := []struct {
		device string
		bad    bool
	}{
		{"/dev/fd/0", true},
		{"/dev/stdin", true},
		{"/dev/null", true},
		{"/dev/zero", true},
		{"/dev/tty1", true},
		{"/dev/pts/0", true},
		{"/dev/shm/disk.img", true},
		{"/dev/mapper/control", true},
		{"/dev/kvm", true},
		{"/dev/net/tun", true},
		{"/dev/ttyS0", true},
		{"/dev/loop0", false},
		{"/dev/vg0/data", false},
		{"/dev/vdb", false},
		{"/dev/nvme0n1p1", false},
		{"/dev/disk/by-id/virtio-data", false},
		{"/dev/mapper/secret", false},
		{"/dev/md/data", false},
	}
	for _, tt := range tests {
		t.Run(tt.device, func(t *testing.T) {
			cfg, err := Parse([]byte(`{"ignition":{"version":"3.5.0"},"storage":{` +
				`"disks":[{"device":"` + tt.device + `"}],` +
				`"raid":[{"name":"r","level":"raid1","devices":["/dev/vdc","` + tt.device + `"]}],` +
				`"luks":[{"name":"l","device":"` + tt.device + `"}],` +
				`"filesystems":[{"device":"` + tt.device + `","format":"ext4"}]}}`))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			err = cfg.Validate()
			if !tt.bad {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			for _, field := range []string{"storage.disks[0].device", "storage.raid[0].devices[1]", "storage.luks[0].device", "storage.filesystems[0].device"} {
				if want := field + `: "` + tt.device + `" is not a block device`; err == nil || !strings.Contains(err.Error(), want) {
					t.Errorf("Validate = %v, want %s", err, want)
				}
			}
		})
	}
}

// TestCheckMountPaths: the links of the image's own tree are followed, inside it: a path
// through a link to where no mount may go is refused, naming both; the host's links do not
// count.
func TestCheckMountPaths(t *testing.T) {
	root := t.TempDir()
	for _, d := range []string{"run", "usr/bin", "usr/share/srv", "var/home", "var/lib", "mnt", "etc/mtab"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	links := map[string]string{
		"var/run":  "/run",           // Debian's
		"bin":      "usr/bin",        // a merged /usr
		"tools":    "usr/bin",        // this image's own
		"home":     "var/home",       // kiln's base: homes on /var
		"srv":      "/usr/share/srv", // this image's own: the host's /srv is a directory
		"opt":      "/proc",          // a hostile one
		"mnt/proc": "../proc/sys",    // relative, through a directory
		"mnt/kiln": "/var/lib/kiln",  // kiln's state
		"loop":     "/loop",          // a cycle
	}
	for name, target := range links {
		if err := os.Symlink(target, filepath.Join(root, name)); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		path string
		want string // "" when accepted
	}{
		{"/mnt/kiln/x", "/mnt/kiln/x leads to /var/lib/kiln/x in the image: /var/lib/kiln/x is in /var/lib/kiln"},
		{"/loop/x", "resolve /loop/x: too many levels of symbolic links"},
		{"/tools/x", "/tools/x leads to /usr/bin/x in the image: /usr/bin/x is in /usr, the image's read-only root"},
		{"/bin/tools", ""}, // refused by Validate as it is written
		{"/srv/www", "/srv/www leads to /usr/share/srv/www in the image"},
		{"/opt/data", "/opt/data leads to /proc/data in the image: /proc/data is in /proc"},
		{"/mnt/proc", "/mnt/proc leads to /proc/sys in the image"},
		{"/home/data", ""},
		{"/var/lib/etcd/main", ""},
		{"/mnt/data", ""},
		{"/var/run/user/data", ""}, // /run/user/data: below /run
		{"/var/run", ""},           // refused by Validate as it is written, not twice
		{"/etc/mtab/data", ""},     // the host's /etc/mtab leads into /proc; the image's is a directory
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			path, other := tt.path, "/var/lib/other"
			err := CheckMountPaths(root, []types.Filesystem{
				{Device: "/dev/vdc", Format: ptr("ext4"), Path: &other},
				{Device: "/dev/vdb", Format: ptr("ext4"), Path: &path},
			})
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("CheckMountPaths: %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), "storage.filesystems[1].path: "+tt.want)):
				t.Fatalf("CheckMountPaths = %v, want storage.filesystems[1].path: %s", err, tt.want)
			}
		})
	}
}
