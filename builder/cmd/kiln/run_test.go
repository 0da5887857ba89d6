package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/kilnproject/kiln/builder/vm"
	"github.com/kilnproject/kiln/initd/config"
)

func TestParseForward(t *testing.T) {
	for _, tc := range []struct {
		in    string
		host  string
		guest int
		err   bool
	}{
		{in: "6443:6443", host: "6443", guest: 6443},
		{in: "127.0.0.1:8443:443", host: "127.0.0.1:8443", guest: 443},
		{in: "0.0.0.0:2222:22", host: "0.0.0.0:2222", guest: 22},
		{in: "6443", err: true},
		{in: ":6443", err: true},
		{in: "6443:", err: true},
		{in: "127.0.0.1:x:22", err: true},
		{in: "2222:70000", err: true},
		{in: "127.0.0.1::22", err: true},
	} {
		host, guest, err := parseForward(tc.in)
		if (err != nil) != tc.err || host != tc.host || guest != tc.guest {
			t.Errorf("parseForward(%q) = %q, %d, %v; want %q, %d (error %v)", tc.in, host, guest, err, tc.host, tc.guest, tc.err)
		}
	}
}

func TestParseLink(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want vm.Link
		err  string
	}{
		{in: "cluster", want: vm.Link{Name: "cluster"}},
		{in: "cluster,mac=02:00:00:00:00:01", want: vm.Link{Name: "cluster", MAC: "02:00:00:00:00:01"}},
		{in: ",mac=02:00:00:00:00:01", err: "want NAME"},
		{in: "cluster,ip=192.168.100.1", err: `unknown option "ip=192.168.100.1"`},
		{in: "cluster,mac=", err: "unknown option"},
	} {
		got, err := parseLink(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("parseLink(%q) = %v, want an error containing %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("parseLink(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
}

// --root and --disk options reach the VM's disks.
func TestParseDisks(t *testing.T) {
	o := runOptions{root: "scsi,serial=persistent-disk-0,vendor=Google,product=PersistentDisk",
		disks: []string{"etcd-main=2G", "vol0123456789abcdef0=1G,bus=nvme", "pd=1G,bus=scsi,vendor=Google,product=PersistentDisk"}}
	var cfg vm.Config
	if err := o.parseDisks(&cfg); err != nil {
		t.Fatal(err)
	}
	wantRoot := vm.Disk{Bus: vm.BusSCSI, Name: "persistent-disk-0", Vendor: "Google", Product: "PersistentDisk"}
	want := []vm.Disk{{Name: "etcd-main", Size: "2G"}, {Name: "vol0123456789abcdef0", Size: "1G", Bus: vm.BusNVMe},
		{Name: "pd", Size: "1G", Bus: vm.BusSCSI, Vendor: "Google", Product: "PersistentDisk"}}
	if cfg.Root != wantRoot || len(cfg.Disks) != len(want) {
		t.Fatalf("root %+v disks %+v", cfg.Root, cfg.Disks)
	}
	for i := range want {
		if cfg.Disks[i] != want[i] {
			t.Errorf("disk %d: %+v, want %+v", i, cfg.Disks[i], want[i])
		}
	}
}

// Several --config files become one Ignition config: each file's entries kept, the later
// file's entry winning for the same path; a mistake names its file.
func TestNodeConfigMerge(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	node := write("node.ign", `{"ignition":{"version":"3.4.0"},"storage":{"files":[
		{"path":"/etc/kiln/node.yaml","mode":384,"contents":{"source":"data:,role%3A%20worker%0A"}},
		{"path":"/etc/hostname","mode":420,"contents":{"source":"data:,old"}}]}}`)
	netw := write("net.bu", `variant: fcos
version: 1.6.0
storage:
  files:
    - path: /etc/systemd/network/10-link.network
      mode: 0644
      contents:
        inline: "[Match]\nMACAddress=02:00:00:00:00:01\n[Network]\nAddress=192.168.100.1/24\n"
    - path: /etc/hostname
      mode: 0644
      contents:
        inline: node-1
`)
	bad := write("bad.bu", "variant: fcos\nversion: 1.6.0\nstorage:\n  filez: []\n")

	out, err := nodeConfig([]string{node, netw}, t.TempDir(), "", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	c, err := config.Parse(raw)
	if err != nil {
		t.Fatalf("merged config does not parse: %v\n%s", err, raw)
	}
	files, err := c.Files()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, f := range files {
		got[f.Path] = string(f.Contents)
	}
	if len(got) != 3 || got["/etc/hostname"] != "node-1" || got["/etc/kiln/node.yaml"] != "role: worker\n" ||
		!strings.Contains(got["/etc/systemd/network/10-link.network"], "Address=192.168.100.1/24") {
		t.Errorf("merged files = %q", got)
	}

	if p, err := nodeConfig([]string{node}, t.TempDir(), "", nil, nil); err != nil || p != node {
		t.Errorf("one Ignition file: %q, %v; want it passed as is", p, err)
	}
	if _, err := nodeConfig([]string{node, bad}, t.TempDir(), "", nil, nil); err == nil || !strings.Contains(err.Error(), "bad.bu") {
		t.Errorf("merge with a bad file: %v, want an error naming bad.bu", err)
	}
}

// Network and disk mistakes on the command line are reported before anything boots.
func TestRunFlagErrors(t *testing.T) {
	img := filepath.Join(t.TempDir(), "node.raw")
	os.WriteFile(img, make([]byte, 4096), 0o644)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--link", "my cluster"}, `link "my cluster": name must be`},
		{[]string{"--link", "c,mac=01:00:00:00:00:01"}, "multicast address"},
		{[]string{"--link", "c", "--link", "c"}, `link "c" given twice`},
		{[]string{"--link", "c,vlan=3"}, `unknown option "vlan=3"`},
		{[]string{"--forward", "6443"}, "want [ADDR:]HOSTPORT:GUESTPORT"},
		{[]string{"--forward", "6443:6443", "--forward", "6443:443"}, "forwarded twice"},
		{[]string{"--root", "nvme"}, "root disk: an NVMe disk needs a serial"},
		{[]string{"--root", "ide,serial=x"}, `root disk: bus "ide"`},
		{[]string{"--root", "scsi,bus=nvme"}, `--root "scsi,bus=nvme": unknown option "bus=nvme"`},
		{[]string{"--disk", "d=1G,bus=nvme,serial=x"}, `unknown option "serial=x"`},
		{[]string{"--disk", "d=1G,vendor=Google"}, "disk d: vendor and product need bus scsi"},
		{[]string{"--disk", "d=1G,bus="}, `option "bus=" has no value`},
		{[]string{"--ssh", "70000"}, "--ssh 70000: a TCP port, 1-65535"},
		{[]string{"--ssh", "2222", "--forward", "2222:80"}, `--ssh 2222: host port 2222 is --forward "2222:80"'s already`},
	} {
		args := append([]string{"run", img, "--accel", "tcg", "--offline"}, tc.args...)
		_, err := kiln(t, args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("kiln %s: %v, want an error containing %q", strings.Join(args, " "), err, tc.want)
		}
	}
}

// Network-boot mistakes are reported before anything boots, and nothing is created.
func TestRunNetBootFlagErrors(t *testing.T) {
	dir := t.TempDir()
	img := filepath.Join(dir, "node.raw")
	os.WriteFile(img, make([]byte, 4096), 0o644)
	iso := filepath.Join(dir, "node.iso")
	os.WriteFile(iso, make([]byte, 4096), 0o644)
	const url = "http://10.0.2.2:8080/boot.ipxe"
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--accel", "tcg"}, "no IMAGE given: name a disk image, an iso, or --netboot URL"},
		{[]string{filepath.Join(dir, "missing.iso"), "--accel", "tcg"}, "cdrom: stat " + filepath.Join(dir, "missing.iso")},
		{[]string{iso, "--snapshot", "--accel", "tcg"}, "snapshot: a diskless machine"},
		{[]string{img, "--mac", "02:00:00:00:00:01"}, "--mac sets the network-booting NIC's address: it needs --netboot"},
		{[]string{filepath.Join(dir, "new.raw"), "--blank", "8G"}, "--blank creates a disk to install onto from the network: it needs --netboot"},
		{[]string{"--netboot", url, "--blank", "8G"}, "--blank SIZE: name the disk IMAGE to create"},
		{[]string{filepath.Join(dir, "new.vmdk"), "--netboot", url, "--blank", "8G", "--accel", "tcg"}, "name the disk to create *.raw, *.img or *.qcow2"},
		{[]string{filepath.Join(dir, "new.raw"), "--netboot", url, "--blank", "eight", "--accel", "tcg"}, "--blank eight: qemu-img create"},
		{[]string{"--netboot", "boot.ipxe", "--accel", "tcg"}, `network boot file "boot.ipxe": want an http://`},
		{[]string{"--netboot", url, "--mac", "01:00:00:00:00:01", "--accel", "tcg"}, "multicast address"},
		{[]string{"--netboot", url, "--uuid", "node-1", "--accel", "tcg"}, `machine UUID "node-1"`},
		{[]string{"--netboot", url, "--snapshot", "--accel", "tcg"}, "snapshot: a diskless machine"},
		{[]string{img, "--netboot", url, "--append", "quiet", "--accel", "tcg"}, "read the image's boot files"},
	} {
		args := append([]string{"run"}, tc.args...)
		_, err := kiln(t, args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("kiln %s: %v, want an error containing %q", strings.Join(args, " "), err, tc.want)
		}
	}
	if m, _ := filepath.Glob(filepath.Join(dir, "new.*")); len(m) > 0 {
		t.Errorf("refused runs left %v behind", m)
	}
}

// --blank creates a missing disk, sparse and of the size asked for, and keeps an existing one
// (the disk a previous boot installed onto) byte for byte.
func TestRunBlankDisk(t *testing.T) {
	if _, err := exec.LookPath("qemu-img"); err != nil {
		t.Skip("qemu-img not installed")
	}
	dir := t.TempDir()
	o := runOptions{blank: "8G", netboot: "http://10.0.2.2:8080/boot.ipxe"}
	img := filepath.Join(dir, "node.raw")
	if err := o.createBlank(context.Background(), img); err != nil {
		t.Fatal(err)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(img, &st); err != nil {
		t.Fatal(err)
	}
	if st.Size != 8<<30 || st.Blocks > 8 {
		t.Errorf("blank disk: %d bytes in %d blocks, want 8 GiB and sparse", st.Size, st.Blocks)
	}
	if err := os.WriteFile(img, []byte("installed"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := o.createBlank(context.Background(), img); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(img); string(b) != "installed" {
		t.Errorf("an existing disk was replaced: %q", b)
	}
}

// --root-size grows an image smaller than it before the boot (the image's first boot gives the
// data partition the space), or only the throwaway overlay with --snapshot; 0 and a --blank disk
// keep their size, and a size qemu-img cannot read is refused naming the flag.
func TestRunRootSize(t *testing.T) {
	if _, err := exec.LookPath("qemu-img"); err != nil {
		t.Skip("qemu-img not installed")
	}
	for _, tc := range []struct {
		name        string
		o           runOptions
		snapshot    bool
		size        int64  // the image's size afterwards
		cfgRootSize string // what is left for vm.Start
		wantErr     string
	}{
		{"grown in place", runOptions{rootSize: "8M"}, false, 8 << 20, "", ""},
		{"already larger", runOptions{rootSize: "4k"}, false, 1 << 20, "", ""},
		{"snapshot: the overlay", runOptions{rootSize: "8M"}, true, 1 << 20, "8M", ""},
		{"0 keeps the size", runOptions{rootSize: "0"}, false, 1 << 20, "", ""},
		{"a --blank disk keeps its size", runOptions{rootSize: "8M", blank: "1M"}, false, 1 << 20, "", ""},
		{"bad size", runOptions{rootSize: "8 GiB"}, false, 1 << 20, "", `--root-size: size "8 GiB"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			img := filepath.Join(t.TempDir(), "node.raw")
			if err := os.WriteFile(img, make([]byte, 1<<20), 0o644); err != nil {
				t.Fatal(err)
			}
			cfg := vm.Config{Image: img, Snapshot: tc.snapshot}
			err := tc.o.growRoot(context.Background(), &cfg)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Errorf("growRoot = %v, want an error containing %q", err, tc.wantErr)
				}
			} else if err != nil {
				t.Fatal(err)
			}
			if fi, err := os.Stat(img); err != nil || fi.Size() != tc.size {
				t.Errorf("image is %d bytes (%v), want %d", fi.Size(), err, tc.size)
			}
			if cfg.RootSize != tc.cfgRootSize {
				t.Errorf("vm.Config.RootSize = %q, want %q", cfg.RootSize, tc.cfgRootSize)
			}
		})
	}
}

// kiln run --ssh enables the image's ssh server in the config it passes, and refuses a config
// whose users have no key or that turns the server off: the port would lead nowhere.
func TestRunSSHConfig(t *testing.T) {
	const key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIO3StSM+Z0fcvKzvDFRc5J42hHUIvqb34l+kqVYzwQ6k test@kiln"
	for _, tc := range []struct {
		name, bu string
		users    string // the users kiln run prints; "" when refused
		wantErr  string
	}{
		{"keys", "passwd:\n  users:\n    - name: core\n      ssh_authorized_keys: [\"" + key + "\"]\n", "core", ""},
		{"keys and ssh enabled already", "passwd:\n  users:\n    - name: ops\n      ssh_authorized_keys: [\"" + key + "\"]\n" +
			"systemd:\n  units:\n    - name: ssh.service\n      enabled: true\n", "ops", ""},
		{"no keys", "passwd:\n  users:\n    - name: core\n", "", "--ssh: no user in the config has sshAuthorizedKeys"},
		{"ssh disabled", "passwd:\n  users:\n    - name: core\n      ssh_authorized_keys: [\"" + key + "\"]\n" +
			"systemd:\n  units:\n    - name: ssh.service\n      enabled: false\n", "", "--ssh: systemd.units[0] disables ssh.service"},
		{"ssh masked", "passwd:\n  users:\n    - name: core\n      ssh_authorized_keys: [\"" + key + "\"]\n" +
			"systemd:\n  units:\n    - name: ssh.service\n      mask: true\n", "", "--ssh: systemd.units[0] masks ssh.service"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "node.bu")
			os.WriteFile(p, []byte("variant: fcos\nversion: 1.7.0\n"+tc.bu), 0o644)
			var users []string
			out, err := nodeConfig([]string{p}, t.TempDir(), "", nil, func(c *config.Config) (err error) {
				users, err = enableSSH(c)
				return err
			})
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), "node.bu") {
					t.Fatalf("err = %v, want %q naming node.bu", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			raw, _ := os.ReadFile(out)
			c, err := config.Parse(raw)
			if err != nil {
				t.Fatalf("passed config does not parse: %v\n%s", err, raw)
			}
			n := 0
			for _, u := range c.Ignition.Systemd.Units {
				if u.Name == "ssh.service" {
					n++
					if u.Enabled == nil || !*u.Enabled {
						t.Errorf("ssh.service in the passed config: enabled %v", u.Enabled)
					}
				}
			}
			if n != 1 {
				t.Errorf("ssh.service appears %d times in the passed config:\n%s", n, raw)
			}
			if strings.Join(users, ",") != tc.users {
				t.Errorf("users with keys %q, want %q", users, tc.users)
			}
		})
	}
}
