package qemutests

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kilnproject/kiln/builder/vm"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

// An installed node updates itself in place and rolls back a bad update by itself. v1 boots
// and keeps a file on /var; v2 (a file more, another kiln-init) is written to slot b from the
// bake's output served over HTTP, boots on trial and is blessed, and the node kept /var, its
// name and its ssh host key. v3, whose stage 1 fails, is written to slot a: after its three
// tries systemd-boot boots v2 again by itself, and kiln-init update status says so. v4, whose
// kernel panics, goes the same way.
func TestUpdateInPlace(t *testing.T) {
	e := newEnv(t)
	kilnInitV2 := filepath.Join(e.dir, "kiln-init-v2")
	build := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w -X main.version=v2-update-test", "-o", kilnInitV2, "./initd/cmd/kiln-init")
	build.Dir, build.Env = repoRoot(t), append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build kiln-init v2: %v\n%s", err, out)
	}
	updateDefinitions(t, e)
	v1 := e.bakeAs("update-v1", "worker", "out-v1", "1000")
	e.bakeAs("update-v2", "worker", "out-v2", "2000", "--kiln-init", kilnInitV2)
	e.bakeAs("update-v3", "worker", "out-v3", "3000")
	e.bakeAs("update-v4", "worker", "out-v4", "4000")
	url := serveOutputs(t, e)

	disk := filepath.Join(e.dir, "node.raw")
	copySparse(t, v1, disk)
	ssh := newSSHClient(t, e.dir)
	cfg := filepath.Join(e.dir, "node.ign")
	writeTestFile(t, cfg, `{"ignition":{"version":"3.4.0"},
		"storage":{"files":[{"path":"/var/lib/kiln-test/kept.txt","contents":{"source":"data:,kept%0A"}}]},
		"passwd":{"users":[{"name":"root","sshAuthorizedKeys":[`+strconv.Quote(ssh.publicKey)+`]}]},
		"systemd":{"units":[{"name":"ssh.service","enabled":true}]}}`)
	m, line := e.bootWith(vm.Config{Image: disk, Config: cfg, Forward: map[string]int{ssh.addr(): 22}},
		regexp.MustCompile(firstbootDone.String()), 10*time.Minute)
	if firstbootOutcome(line) != nodeimage.OutcomeOK {
		t.Fatalf("first boot of v1: %s\n%s", line, tail(m.Lines(), 30))
	}
	before := ssh.runAs(t, "root", "accept-new", 3*time.Minute, "hostname; kiln-init --version")

	out := ssh.runAs(t, "root", "yes", time.Minute, "kiln-init update --from "+url("out-v2"))
	if !strings.Contains(out, "slot b (") || !strings.Contains(out, "entry kiln-b+3.conf boots next, on trial") {
		t.Fatalf("kiln-init update to v2:\n%s", out)
	}
	t.Logf("update to v2: %s", strings.TrimSpace(out))
	ssh.fire("root", "systemctl reboot")
	waitConsole(t, m, `kiln-init: slot b is good: entry kiln-b.conf blessed`, 10*time.Minute)
	after := ssh.runAs(t, "root", "yes", 3*time.Minute, "hostname; kiln-init --version; cat /etc/kiln-v2-marker /var/lib/kiln-test/kept.txt; kiln-init update status")
	t.Logf("on v2:\n%s", after)
	hostname := strings.SplitN(before, "\n", 2)[0]
	for _, want := range []string{hostname + "\n", "v2-update-test\n", "v2\nkept\n", "found good"} {
		if !strings.Contains(after, want) {
			t.Errorf("after the update to v2 the node lacks %q:\n%s", want, after)
		}
	}
	if !regexp.MustCompile(`(?m)^b .*qemu-worker.*kiln-b\.conf\s+-\s+good, booted, boots next$`).MatchString(after) {
		t.Errorf("update status does not show slot b good, booted and next:\n%s", after)
	}

	out = ssh.runAs(t, "root", "yes", time.Minute, "kiln-init update --from "+url("out-v3"))
	if !strings.Contains(out, "entry kiln-a+3.conf boots next, on trial") {
		t.Fatalf("kiln-init update to v3:\n%s", out)
	}
	ssh.fire("root", "systemctl reboot")
	waitConsole(t, m, `kiln-init: update rolled back: booted slot b again: slot a \(qemu-worker\) failed its 3 tries`, 15*time.Minute)
	tries := 0
	for _, l := range m.Lines() {
		if strings.Contains(l, `kiln-init: this boot tried \loader\entries\kiln-a+`) {
			tries++
		}
	}
	if tries != 3 {
		t.Errorf("stage 1 rebooted %d failed tries of slot a, want 3", tries)
	}
	status := ssh.runAs(t, "root", "yes", 3*time.Minute, "cat /etc/kiln-v2-marker; kiln-init update status")
	t.Logf("after the rollback:\n%s", status)
	for _, want := range []string{"v2\n", "rolled back to slot b", "failed its 3 tries"} {
		if !strings.Contains(status, want) {
			t.Errorf("after the rollback the node lacks %q:\n%s", want, status)
		}
	}
	if !regexp.MustCompile(`(?m)^a .*kiln-a\+0-3\.conf\s+0\s+failed$`).MatchString(status) {
		t.Errorf("update status does not show slot a failed:\n%s", status)
	}

	out = ssh.runAs(t, "root", "yes", time.Minute, "kiln-init update --from "+url("out-v4"))
	if !strings.Contains(out, "entry kiln-a+3.conf boots next, on trial") {
		t.Fatalf("kiln-init update to v4:\n%s", out)
	}
	from := len(m.Lines())
	ssh.fire("root", "systemctl reboot")
	waitConsoleAfter(t, m, from, `kiln-init: update rolled back: booted slot b again: slot a \(qemu-worker\) failed its 3 tries`, 15*time.Minute)
	panics := 0
	for _, l := range m.Lines()[from:] {
		if strings.Contains(l, "Kernel panic - not syncing") {
			panics++
		}
	}
	if panics != 3 {
		t.Errorf("slot a's kernel panicked %d times before the rollback, want 3", panics)
	}
}

// updateDefinitions writes the update tests' definitions into the repository copy: v1, the
// default qemu image with the pxe format (what an update reads); v2, v1 and a file
// (/etc/kiln-v2-marker); v3, v1 whose stage 1 refuses its own command line.
func updateDefinitions(t *testing.T, e *env) {
	t.Helper()
	def, err := os.ReadFile(filepath.Join(e.repo, "images", "qemu.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	base := strings.Replace(string(def), "formats: [raw, qcow2, pxe]", "formats: [raw, pxe]", 1)
	writeTestFile(t, filepath.Join(e.repo, "images", "update-v1.yaml"), base)
	writeTestFile(t, filepath.Join(e.repo, "images", "update-v2.yaml"), strings.Replace(base, "overlays: [base]", "overlays: [base, v2-marker]", 1))
	writeTestFile(t, filepath.Join(e.repo, "overlays", "v2-marker", "etc", "kiln-v2-marker"), "v2\n")
	writeTestFile(t, filepath.Join(e.repo, "images", "update-v3.yaml"), strings.Replace(base, `"tsc=reliable"]`, `"tsc=reliable", "kiln.rootwait=never"]`, 1))
	// v4's kernel panics: it finds no init in the initramfs and cannot mount a root without
	// the initramfs' modules.
	writeTestFile(t, filepath.Join(e.repo, "images", "update-v4.yaml"), strings.Replace(base, `"tsc=reliable"]`, `"tsc=reliable", "rdinit=/nonexistent"]`, 1))
}

// serveOutputs serves e.dir over HTTP on the host and returns the URL of out/qemu-worker.json
// as a guest reaches it.
func serveOutputs(t *testing.T, e *env) func(out string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.FileServer(http.Dir(e.dir))}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return func(out string) string {
		return fmt.Sprintf("http://10.0.2.2:%d/%s/qemu-worker.json", ln.Addr().(*net.TCPAddr).Port, out)
	}
}

// bakeAs bakes images/<def>.yaml (an update definition, named qemu) for role into
// e.dir/<out> as created at epoch.
func (e *env) bakeAs(def, role, out, epoch string, flags ...string) string {
	e.t.Helper()
	return e.bakeInto(def, role, out, "qemu", epoch, flags...)
}

func writeTestFile(t *testing.T, path, text string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}

// waitConsoleAfter waits for a console line matching re among those from line from on (what
// came after an earlier wait), failing the test with the console's tail.
func waitConsoleAfter(t *testing.T, m *vm.Machine, from int, re string, timeout time.Duration) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	start := time.Now()
	line, err := waitUnstalled(ctx, consoleFrom{m, from}, regexp.MustCompile(re), stallGrace, t.Logf)
	if err != nil {
		t.Fatalf("waiting for %q: %v\n%s", re, err, tail(m.Lines(), 40))
	}
	t.Logf("console %q after %s", strings.TrimSpace(line), time.Since(start).Round(time.Millisecond))
	return line
}

// waitConsole waits for a console line matching re, failing the test with the console's tail.
func waitConsole(t *testing.T, m *vm.Machine, re string, timeout time.Duration) string {
	t.Helper()
	return waitConsoleAfter(t, m, 0, re, timeout)
}

// consoleFrom is a machine's console from a line on.
type consoleFrom struct {
	m    *vm.Machine
	from int
}

func (c consoleFrom) WaitFor(ctx context.Context, re *regexp.Regexp) (string, error) {
	return c.m.WaitFrom(ctx, c.from, re)
}

// A power cut while an update writes the other slot leaves the node booting its running
// image: QEMU is killed while the root image goes onto slot b, while it is read back and
// while the kernel and initramfs go onto the ESP (the moment between those and the entry is
// too short to hit from outside; TestApplyStopped in initd/update stops there); each time v1
// boots, with slot b without an entry, and the next update goes through and boots.
func TestUpdatePowerCut(t *testing.T) {
	e := newEnv(t)
	updateDefinitions(t, e)
	v1 := e.bakeAs("update-v1", "worker", "out-v1", "1000")
	e.bakeAs("update-v2", "worker", "out-v2", "2000")
	from := serveOutputs(t, e)("out-v2")

	disk := filepath.Join(e.dir, "node.raw")
	copySparse(t, v1, disk)
	ssh := newSSHClient(t, e.dir)
	cfg := filepath.Join(e.dir, "node.ign")
	writeTestFile(t, cfg, `{"ignition":{"version":"3.4.0"},
		"passwd":{"users":[{"name":"root","sshAuthorizedKeys":[`+strconv.Quote(ssh.publicKey)+`]}]},
		"systemd":{"units":[{"name":"ssh.service","enabled":true}]}}`)
	boot := func(what string) *vm.Machine {
		m, line := e.bootWith(vm.Config{Image: disk, Config: cfg, Forward: map[string]int{ssh.addr(): 22}},
			regexp.MustCompile(firstbootDone.String()), 10*time.Minute)
		if o := firstbootOutcome(line); o != nodeimage.OutcomeOK && !strings.Contains(line, "done already") {
			t.Fatalf("%s: %s\n%s", what, line, tail(m.Lines(), 30))
		}
		return m
	}
	hostKeys := "accept-new"
	for _, cut := range []struct {
		name  string
		after string        // the update's log line to wait for
		delay time.Duration // then this long before the cut
	}{
		{"while the root image is written", `msg="writing the root image"`, 3 * time.Second},
		{"while the root image is read back", `msg="root image written"`, 0},
		{"while the kernel and initramfs are written", `msg="root image verified on the disk"`, 0},
	} {
		m := boot("boot before the cut " + cut.name)
		ssh.runAs(t, "root", hostKeys, 3*time.Minute, "true")
		hostKeys = "yes"
		logPath := filepath.Join(e.dir, "update.log")
		logf, err := os.Create(logPath)
		if err != nil {
			t.Fatal(err)
		}
		cmd := ssh.command("root", "yes", "kiln-init update --from "+from)
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(5 * time.Minute)
		for {
			b, _ := os.ReadFile(logPath)
			if strings.Contains(string(b), cut.after) {
				break
			}
			if strings.Contains(string(b), "boots next") || time.Now().After(deadline) {
				t.Fatalf("the update ended before the cut %s:\n%s", cut.name, b)
			}
			time.Sleep(200 * time.Millisecond)
		}
		time.Sleep(cut.delay)
		m.Stop() // the power cut
		cmd.Process.Kill()
		cmd.Wait()
		logf.Close()
		b, _ := os.ReadFile(logPath)
		t.Logf("power cut %s; the update had logged:\n%s", cut.name, b)
		if strings.Contains(string(b), "boots next") {
			t.Fatalf("the update finished before the cut %s", cut.name)
		}

		m = boot("boot after the cut " + cut.name)
		status := ssh.runAs(t, "root", "yes", 3*time.Minute, "test ! -e /etc/kiln-v2-marker && kiln-init update status")
		if !regexp.MustCompile(`(?m)^a .*kiln-a\.conf\s+-\s+good, booted, boots next$`).MatchString(status) ||
			!regexp.MustCompile(`(?m)^b .*no entry$`).MatchString(status) {
			t.Fatalf("after the power cut %s, update status:\n%s", cut.name, status)
		}
		m.Stop()
	}
	m := boot("boot before the last update")
	out := ssh.runAs(t, "root", "yes", 3*time.Minute, "kiln-init update --from "+from)
	if !strings.Contains(out, "entry kiln-b+3.conf boots next, on trial") {
		t.Fatalf("update after the power cuts:\n%s", out)
	}
	// The power goes once more, after the update: the next boot is slot b's first try.
	m.Stop()
	m = boot("boot after the last update")
	waitConsole(t, m, `kiln-init: slot b is good: entry kiln-b.conf blessed`, 10*time.Minute)
	if got := ssh.runAs(t, "root", "yes", 3*time.Minute, "cat /etc/kiln-v2-marker"); got != "v2\n" {
		t.Errorf("v2's file after the update: %q", got)
	}
}
