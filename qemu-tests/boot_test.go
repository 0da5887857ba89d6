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
// config that writes a file, see the first-boot status line, find the file and status.json on
// the data partition; boot the same disk again and see that /var kept its data and that first
// boot did not run twice.
func TestWorkerBootsTwice(t *testing.T) {
	e := newEnv(t)
	baked := e.bake("qemu", "worker")
	disk := filepath.Join(e.dir, "node.raw")
	copySparse(t, baked, disk)
	cfg := filepath.Join(e.dir, "node.ign")
	const hello = "hello from the first boot\n"
	ssh := newSSHClient(t, e.dir)
	// /etc, /usr/local and /opt are writable, as on Fedora CoreOS; a user in the groups FCOS
	// configs name logs in over ssh with its key.
	if err := os.WriteFile(cfg, []byte(`{"ignition":{"version":"3.4.0"},"storage":{"files":[
		{"path":"/etc/kiln/hello.txt","mode":384,"contents":{"source":"data:,hello%20from%20the%20first%20boot%0A"}},
		{"path":"/usr/local/bin/hello","mode":493,"contents":{"source":"data:,%23!/bin/sh%0Aecho%20hello%0A"}},
		{"path":"/opt/kiln-test/hello.txt","contents":{"source":"data:,opt%0A"}}]},
		"passwd":{"users":[{"name":"core","groups":["wheel","sudo"],"sshAuthorizedKeys":[`+strconv.Quote(ssh.publicKey)+`]}]},
		"systemd":{"units":[{"name":"ssh.service","enabled":true}]}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	threeFiles := regexp.MustCompile(regexp.QuoteMeta(nodeimage.StatusLinePrefix+nodeimage.OutcomeOK) + ` source=fw_cfg files=3|` + firstbootFailed)

	m, line := e.bootWith(vm.Config{Image: disk, Config: cfg, Forward: map[string]int{ssh.addr(): 22}}, threeFiles, 10*time.Minute)
	if firstbootOutcome(line) != nodeimage.OutcomeOK {
		t.Fatalf("first boot: %s\n%s", line, tail(m.Lines(), 30))
	}
	// The host key is the node's own, made at first boot: accepted here, required unchanged
	// on the second boot.
	if out := ssh.run(t, "accept-new", 3*time.Minute, "id -nG; ls /etc/ssh/"); !strings.Contains(out, "wheel") || !strings.Contains(out, "sudo") ||
		!strings.Contains(out, "ssh_host_ed25519_key") {
		t.Errorf("ssh core@node 'id -nG; ls /etc/ssh': %q; want the groups wheel and sudo and the node's host keys", out)
	}
	m.Stop() // kiln-init syncs before it prints the line
	requireTSCClock(t, m.Lines())

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
	if st1.State != "ok" || st1.Source != "fw_cfg" || len(st1.Files) != 3 || st1.Files[0].Path != "/etc/kiln/hello.txt" {
		t.Fatalf("status.json after first boot = %+v", st1)
	}
	machineID, err := e.dataFile(disk, "/lib/kiln/etc/upper/machine-id")
	if err != nil || len(strings.TrimSpace(machineID)) != 32 {
		t.Fatalf("machine-id committed at first boot = %q, %v", machineID, err)
	}

	// Second boot of the same disk, with no config at all: nothing is redone.
	m, line = e.bootWith(vm.Config{Image: disk, Forward: map[string]int{ssh.addr(): 22}}, firstbootDone, 10*time.Minute)
	ssh.run(t, "yes", 3*time.Minute, "true") // the same host key, or ssh refuses
	m.Stop()
	if firstbootOutcome(line) != nodeimage.OutcomeDone {
		t.Fatalf("second boot printed %q, want the done-already line", line)
	}
	for _, l := range m.Lines() {
		if strings.Contains(l, "making data filesystem") || strings.Contains(l, "created data partition") {
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
