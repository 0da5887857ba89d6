package qemutests

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kilnproject/kiln/builder/vm"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

var (
	firstbootOK = regexp.MustCompile(regexp.QuoteMeta(nodeimage.StatusLinePrefix+nodeimage.OutcomeOK) + ` source=fw_cfg files=1`)
	// firstbootDone matches the first-boot status line, whatever the outcome.
	firstbootDone = nodeimage.StatusLineRE
	// firstbootFailed matches the status line of a failed first boot, to end a wait at once.
	firstbootFailed = regexp.QuoteMeta(nodeimage.StatusLinePrefix + nodeimage.OutcomeFailed)
)

// firstbootOutcome is the outcome of the status line in line ("" when there is none).
func firstbootOutcome(line string) string {
	st, _ := nodeimage.ParseStatusLine(line)
	return st.Outcome
}

type status struct {
	State    string `json:"state"`
	Source   string `json:"source"`
	Finished string `json:"finished"`
	Files    []struct {
		Path   string `json:"path"`
		SHA256 string `json:"sha256"`
	} `json:"files"`
}

// The walking skeleton, as a user meets it: bake the worker image, boot it through UEFI with a
// config that writes files, lays a RAID0 and a LUKS volume on three more disks and lets a user
// in over ssh; see the first-boot status line, log in, find the files and status.json on the
// data partition; boot the same disks again and see that /var kept its data, that first boot
// did not run twice and that the arrays, volumes and filesystems came back unformatted.
func TestWorkerBootsTwice(t *testing.T) {
	e := newEnv(t)
	baked := e.bake("qemu", "worker")
	disk := filepath.Join(e.dir, "node.raw")
	copySparse(t, baked, disk)
	cfg := filepath.Join(e.dir, "node.ign")
	const hello = "hello from the first boot\n"
	ssh := newSSHClient(t, e.dir)
	// /etc, /usr/local and /opt are writable, as on Fedora CoreOS; a user in the groups FCOS
	// configs name logs in over ssh with its key. The storage section is the typical one: a
	// RAID0 over two disks for containerd's store and a LUKS data disk with its key in the
	// config, each with a filesystem that files of the config land on.
	if err := os.WriteFile(cfg, []byte(`{"ignition":{"version":"3.4.0"},"storage":{
		"disks":[
			{"device":"/dev/disk/by-id/virtio-raid-a","wipeTable":true,"partitions":[{"number":1,"label":"raid-a"}]},
			{"device":"/dev/disk/by-id/virtio-raid-b","wipeTable":true,"partitions":[{"number":1,"label":"raid-b"}]}],
		"raid":[{"name":"data","level":"raid0","devices":["/dev/disk/by-partlabel/raid-a","/dev/disk/by-partlabel/raid-b"]}],
		"luks":[{"name":"secret","device":"/dev/disk/by-id/virtio-secret","label":"secret","keyFile":{"source":"data:,not-a-real-key"}}],
		"filesystems":[
			{"device":"/dev/md/data","format":"ext4","label":"containerd","path":"/var/lib/containerd"},
			{"device":"/dev/mapper/secret","format":"xfs","label":"secret","path":"/var/lib/secret","mountOptions":["noatime"]}],
		"files":[
		{"path":"/etc/kiln/hello.txt","mode":384,"contents":{"source":"data:,hello%20from%20the%20first%20boot%0A"}},
		{"path":"/usr/local/bin/hello","mode":493,"contents":{"source":"data:,%23!/bin/sh%0Aecho%20hello%0A"}},
		{"path":"/opt/kiln-test/hello.txt","contents":{"source":"data:,opt%0A"}},
		{"path":"/var/lib/containerd/kiln-marker","contents":{"source":"data:,raid%0A"}},
		{"path":"/var/lib/secret/kiln-marker","contents":{"source":"data:,luks%0A"}}]},
		"passwd":{"users":[{"name":"core","groups":["wheel","sudo"],"sshAuthorizedKeys":[`+strconv.Quote(ssh.publicKey)+`]}]},
		"systemd":{"units":[{"name":"ssh.service","enabled":true}]}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	var disks []vm.Disk
	for _, d := range []struct{ name, size string }{{"raid-a", "128M"}, {"raid-b", "128M"}, {"secret", "512M"}} {
		p := filepath.Join(e.dir, d.name+".qcow2")
		e.run(e.dir, "qemu-img", "create", "-q", "-f", "qcow2", p, d.size)
		disks = append(disks, vm.Disk{Name: d.name, Path: p})
	}
	fiveFiles := regexp.MustCompile(regexp.QuoteMeta(nodeimage.StatusLinePrefix+nodeimage.OutcomeOK) + ` source=fw_cfg files=5|` + firstbootFailed)

	m, line := e.bootWith(vm.Config{Image: disk, Config: cfg, Disks: disks, Forward: map[string]int{ssh.addr(): 22}}, fiveFiles, 10*time.Minute)
	if firstbootOutcome(line) != nodeimage.OutcomeOK {
		t.Fatalf("first boot: %s\n%s", line, tail(m.Lines(), 30))
	}
	// The host key is the node's own, made at first boot: accepted here, required unchanged
	// on the second boot.
	if out := ssh.run(t, "accept-new", 3*time.Minute, "id -nG; ls /etc/ssh/"); !strings.Contains(out, "wheel") || !strings.Contains(out, "sudo") ||
		!strings.Contains(out, "ssh_host_ed25519_key") {
		t.Errorf("ssh core@node 'id -nG; ls /etc/ssh': %q; want the groups wheel and sudo and the node's host keys", out)
	}
	storage1 := storageSeen(t, ssh.run(t, "yes", time.Minute, storageCommand))
	m.Stop() // kiln-init syncs before it prints the line
	requireTSCClock(t, m.Lines())
	requireVerifiedRoot(t, m.Lines())
	// The image is only as large as its partitions; the disk the node boots was grown (as kiln
	// run and a larger cloud volume do), and first boot gave the data partition the rest.
	if fi, err := os.Stat(baked); err != nil || fi.Size() >= 2<<30 {
		t.Errorf("the baked worker is %d bytes (%v), want it only as large as its partitions (< 2 GiB)", fi.Size(), err)
	}
	if n := dataPartitionBytes(m.Lines()); n < 3<<30 {
		t.Errorf("first boot's data partition is %d bytes, want the grown disk's rest (> 3 GiB of %s)", n, rootSize)
	}

	// /etc is an overlay whose upper dir lives on the data partition (mounted on /var).
	got, err := e.dataFile(disk, "/lib/kiln/etc/upper/kiln/hello.txt")
	if err != nil || got != hello {
		t.Fatalf("config file on the data partition = %q, %v; want %q", got, err, hello)
	}
	for path, want := range map[string]string{"/lib/kiln/usrlocal/upper/bin/hello": "#!/bin/sh\necho hello\n", "/lib/kiln/opt/upper/kiln-test/hello.txt": "opt\n"} {
		if got, err := e.dataFile(disk, path); err != nil || got != want {
			t.Errorf("%s on the data partition = %q, %v; want %q", path, got, err, want)
		}
	}
	raw, err := e.dataFile(disk, "/lib/kiln/status.json")
	if err != nil {
		t.Fatal(err)
	}
	var st1 status
	if err := json.Unmarshal([]byte(raw), &st1); err != nil {
		t.Fatalf("status.json %q: %v", raw, err)
	}
	if st1.State != "ok" || st1.Source != "fw_cfg" || len(st1.Files) != 5 || st1.Files[0].Path != "/etc/kiln/hello.txt" {
		t.Fatalf("status.json after first boot = %+v", st1)
	}
	machineID, err := e.dataFile(disk, "/lib/kiln/etc/upper/machine-id")
	if err != nil || len(strings.TrimSpace(machineID)) != 32 {
		t.Fatalf("machine-id committed at first boot = %q, %v", machineID, err)
	}

	// Second boot of the same disks, with no config at all: nothing is redone.
	m, line = e.bootWith(vm.Config{Image: disk, Disks: disks, Forward: map[string]int{ssh.addr(): 22}}, firstbootDone, 10*time.Minute)
	// The same host key, or ssh refuses; the same arrays, volumes and filesystems, set up
	// by systemd from the units and /etc/crypttab first boot wrote, not made again.
	out := ssh.run(t, "yes", 3*time.Minute, storageCommand)
	m.Stop()
	if storage2 := storageSeen(t, out); storage2 != storage1 {
		t.Errorf("storage after the second boot:\n%s\nafter the first:\n%s", storage2, storage1)
	}
	if firstbootOutcome(line) != nodeimage.OutcomeDone {
		t.Fatalf("second boot printed %q, want the done-already line", line)
	}
	for _, l := range m.Lines() {
		if strings.Contains(l, "making data filesystem") || strings.Contains(l, "created data partition") || strings.Contains(l, "formatted ") {
			t.Errorf("second boot re-created the data partition: %q", l)
		}
	}
	raw2, err := e.dataFile(disk, "/lib/kiln/status.json")
	if err != nil || raw2 != raw {
		t.Errorf("status.json changed on the second boot:\n%s\nwas\n%s (%v)", raw2, raw, err)
	}
	if got, err := e.dataFile(disk, "/lib/kiln/etc/upper/kiln/hello.txt"); err != nil || got != hello {
		t.Errorf("config file after the second boot = %q, %v", got, err)
	}
	if id2, err := e.dataFile(disk, "/lib/kiln/etc/upper/machine-id"); err != nil || id2 != machineID {
		t.Errorf("machine-id changed across boots: %q -> %q (%v)", machineID, id2, err)
	}
}

// storageCommand shows, over ssh, what the test's storage section made: the two mounts, the
// array and the files written onto them.
const storageCommand = `findmnt -rn -o TARGET,FSTYPE,LABEL,UUID /var/lib/containerd; findmnt -rn -o TARGET,FSTYPE,LABEL,UUID /var/lib/secret; ` +
	`grep -A1 '^md' /proc/mdstat; lsblk -rno NAME,TYPE | grep -w crypt; cat /var/lib/containerd/kiln-marker /var/lib/secret/kiln-marker`

// storageSeen checks storageCommand's output: containerd's store on an ext4 over a RAID0 of
// the two disks, the xfs on the opened LUKS volume, both markers. It returns the mounts'
// lines (filesystem UUIDs included), which a reformatted filesystem would change.
func storageSeen(t *testing.T, out string) string {
	t.Helper()
	var mounts []string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "/var/lib/") {
			mounts = append(mounts, l)
		}
	}
	ok := len(mounts) == 2 &&
		strings.HasPrefix(mounts[0], "/var/lib/containerd ext4 containerd ") &&
		strings.HasPrefix(mounts[1], "/var/lib/secret xfs secret ") &&
		regexp.MustCompile(`(?m)^md\S+ : active raid0 vd\S+ vd\S+`).MatchString(out) &&
		regexp.MustCompile(`(?m)^secret crypt$`).MatchString(out) &&
		strings.Contains(out, "raid\nluks\n")
	if !ok {
		t.Errorf("storage on the node (%s):\n%s\nwant /var/lib/containerd an ext4 labelled containerd on an active RAID0 of two disks, /var/lib/secret an xfs labelled secret on the opened LUKS volume secret, and the config's files on both", storageCommand, out)
	}
	return strings.Join(mounts, "\n")
}

// requireTSCClock fails unless the guest kernel keeps the TSC as its clock source. QEMU's
// emulated CPUs (qemu64 under TCG: an AMD vendor, no invariant-TSC bit) make Linux distrust the
// TSC of a multi-CPU guest and fall back to the HPET, which has no vDSO: every clock read of
// every Go program (kubelet, containerd, etcd, the API server) becomes a system call and an
// emulated device access. The qemu image's tsc=reliable keeps the TSC.
func requireTSCClock(t *testing.T, console []string) {
	t.Helper()
	clock := ""
	for _, l := range console {
		if _, after, ok := strings.Cut(l, "clocksource: Switched to clocksource "); ok {
			clock = strings.TrimSpace(after)
		}
	}
	if clock != "tsc" {
		t.Errorf("the guest's clock source is %q, want tsc (the HPET has no vDSO: every clock read traps)", clock)
	}
}

// requireVerifiedRoot fails unless stage 1 mounted root-a through dm-verity.
func requireVerifiedRoot(t *testing.T, lines []string) {
	t.Helper()
	for _, l := range lines {
		if strings.Contains(l, "root verified by dm-verity") && strings.Contains(l, "root="+nodeimage.RootAName) {
			return
		}
	}
	t.Errorf("stage 1 did not say it mounted root-a through dm-verity (no \"root verified by dm-verity\" line)")
}

// dataPartitionBytes is the size stage 1 logged when it created the data partition, 0 if it
// did not.
func dataPartitionBytes(lines []string) int64 {
	for _, l := range lines {
		if !strings.Contains(l, "created data partition") {
			continue
		}
		if _, after, ok := strings.Cut(l, " bytes="); ok {
			n, _ := strconv.ParseInt(strings.Fields(after)[0], 10, 64)
			return n
		}
	}
	return 0
}
