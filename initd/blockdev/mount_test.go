package blockdev

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func TestUnitName(t *testing.T) {
	tests := []struct{ where, want string }{
		{"/var/lib/etcd/my-cluster", `var-lib-etcd-my\x2dcluster.mount`},
		{"/var/lib/etcd", "var-lib-etcd.mount"},
		{"/var/lib/etcd/", "var-lib-etcd.mount"},
		{"//var//lib", "var-lib.mount"},
		{"/", "-.mount"},
		{"/.hidden/a.b", `\x2ehidden-a.b.mount`},
		{"/data/a b", `data-a\x20b.mount`},
		{"/data/ü:x_y", `data-\xc3\xbc:x_y.mount`},
		{`/a\b`, `a\x5cb.mount`},
	}
	_, haveEscape := exec.LookPath("systemd-escape")
	for _, tt := range tests {
		got, err := unitName(tt.where)
		if err != nil || got != tt.want {
			t.Errorf("UnitName(%q) = %q, %v; want %q", tt.where, got, err, tt.want)
		}
		if haveEscape == nil {
			out, err := exec.Command("systemd-escape", "--path", "--suffix=mount", tt.where).Output()
			if err != nil {
				t.Fatalf("systemd-escape %s: %v", tt.where, err)
			}
			if s := strings.TrimSpace(string(out)); s != got {
				t.Errorf("UnitName(%q) = %q; systemd-escape says %q", tt.where, got, s)
			}
		}
	}
	for _, bad := range []string{"var/lib", "", "/a/../b", "/a/./b"} {
		if name, err := unitName(bad); err == nil {
			t.Errorf("UnitName(%q) = %q; want an error", bad, name)
		}
	}
}

func TestMountUnit(t *testing.T) {
	root := t.TempDir()
	what := ByUUIDPath("0b6e3f5c-1a2b-4c3d-8e9f-a0b1c2d3e4f5")
	changed, err := MountUnit(root, what, "/var/lib/etcd/my-cluster", "ext4")
	if err != nil || !changed {
		t.Fatalf("MountUnit = %v, %v; want changed", changed, err)
	}
	name := `var-lib-etcd-my\x2dcluster.mount`
	unit, err := os.ReadFile(filepath.Join(root, "etc/systemd/system", name))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{
		"What=" + what, "Where=/var/lib/etcd/my-cluster", "Type=ext4", "Options=noatime,nofail",
		"Before=containerd.service kubelet.service", "WantedBy=local-fs.target",
	} {
		if !strings.Contains(string(unit), "\n"+line+"\n") {
			t.Errorf("unit lacks %q:\n%s", line, unit)
		}
	}
	link := filepath.Join(root, "etc/systemd/system/local-fs.target.wants", name)
	if dest, err := os.Readlink(link); err != nil || dest != "/etc/systemd/system/"+name {
		t.Errorf("enablement link %s -> %q, %v", link, dest, err)
	}
	if changed, err := MountUnit(root, what, "/var/lib/etcd/my-cluster", "ext4"); err != nil || changed {
		t.Errorf("second MountUnit = %v, %v; want unchanged", changed, err)
	}
	// A new device (the disk was replaced and formatted again) rewrites the unit.
	if changed, err := MountUnit(root, ByUUIDPath("11111111-2222-3333-4444-555555555555"), "/var/lib/etcd/my-cluster", "ext4"); err != nil || !changed {
		t.Errorf("MountUnit with a new UUID = %v, %v; want changed", changed, err)
	}
	if entries, _ := os.ReadDir(filepath.Join(root, "etc/systemd/system")); len(entries) != 2 {
		t.Errorf("etc/systemd/system holds %d entries, want the unit and the wants dir (no temp files)", len(entries))
	}
	if analyze, err := exec.LookPath("systemd-analyze"); err == nil {
		out, err := exec.Command(analyze, "verify", "--root="+root, "--man=no", "/etc/systemd/system/"+name).CombinedOutput()
		if err != nil || len(out) > 0 {
			t.Errorf("systemd-analyze verify: %s", out)
		}
	}
}

func TestMountUnitBadInput(t *testing.T) {
	root := t.TempDir()
	for _, tc := range []struct{ what, where, fstype, want string }{
		{"/dev/vdb", "/var/lib/etcd", "ext4", "not a stable name under /dev/disk/"},
		{"/dev/disk/by-uuid/x/../../vdb", "/var/lib/etcd", "ext4", "not a stable name"},
		{"/dev/disk/by-uuid/x", "var/lib/etcd", "ext4", "not an absolute path"},
		{"/dev/disk/by-uuid/x", "/var/lib/etcd", "", "filesystem type"},
	} {
		if _, err := MountUnit(root, tc.what, tc.where, tc.fstype); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("MountUnit(%q, %q, %q) = %v; want an error with %q", tc.what, tc.where, tc.fstype, err, tc.want)
		}
	}
}

func TestParseMountInfo(t *testing.T) {
	data := `22 27 0:21 / /proc rw,relatime - proc proc rw
90 27 254:16 / /var/lib/etcd rw,noatime shared:50 - ext4 /dev/vdb rw
91 27 7:0 / /mnt/a\040b rw - xfs /dev/loop0 rw
92 90 0:50 / /var/lib/etcd rw - tmpfs tmpfs rw
`
	mounts, err := parseMountInfo([]byte(data), "mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	if m, ok := mountedAt(mounts, "/var/lib/etcd"); !ok || m.fstype != "tmpfs" {
		t.Errorf("mountedAt /var/lib/etcd = %+v; want the tmpfs stacked on top", m)
	}
	if m, ok := mountedAt(mounts, "/mnt/a b"); !ok || m.majMin != "7:0" || m.source != "/dev/loop0" {
		t.Errorf("mountedAt /mnt/a b = %+v, %v", m, ok)
	}
	if _, ok := mountedAt(mounts, "/mnt"); ok {
		t.Error("/mnt is not a mount point")
	}
	if _, err := parseMountInfo([]byte("garbage\n"), "mountinfo"); err == nil || !strings.Contains(err.Error(), "mountinfo:1") {
		t.Errorf("bad line: %v", err)
	}
}
