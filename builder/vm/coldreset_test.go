package vm

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// standIn writes a disk image and a stand-in QEMU: a shell script that appends a line to a
// file on each start, prints "boot N" (N its start) and then does what cases (a shell case
// body on $n) say, after the lines of prelude. It returns the image and the script.
func standIn(t *testing.T, prelude, cases string) (img, qemu string) {
	t.Helper()
	if _, _, err := Firmware(); err != nil {
		t.Skip(err)
	}
	dir := t.TempDir()
	img = filepath.Join(dir, "disk.raw")
	if err := os.WriteFile(img, make([]byte, 4096), 0o644); err != nil {
		t.Fatal(err)
	}
	count := filepath.Join(dir, "starts")
	qemu = filepath.Join(dir, "qemu-system-x86_64")
	script := "#!/bin/sh\n" + prelude + "echo x >> " + count + "\nn=$(wc -l < " + count + ")\necho \"boot $n\"\ncase $n in\n" + cases + "esac\n"
	if err := os.WriteFile(qemu, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return img, qemu
}

// A guest that reboots, panics (panic=N) and then powers off, under a stand-in QEMU that counts its
// starts in a file and insists on -no-reboot: with ColdReset the Machine runs it three times,
// one console throughout, and ends with the power-off.
func TestColdReset(t *testing.T) {
	img, qemu := standIn(t, `case " $* " in *" -no-reboot "*) ;; *) echo "no -no-reboot"; exit 1 ;; esac
`, `1) echo "[   1.0] reboot: Restarting system" ;;
2) echo "[   1.0] Kernel panic - not syncing: VFS: Unable to mount root fs"; echo "[   1.1] Rebooting in 10 seconds.." ;;
*) echo "[   1.0] reboot: Power down" ;;
`)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m, err := Start(ctx, Config{Image: img, Accel: "tcg", QEMU: qemu, WorkDir: t.TempDir(), ColdReset: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.WaitFor(ctx, regexp.MustCompile(`reboot: Power down`)); err != nil {
		t.Fatalf("%v\n%s", err, strings.Join(m.Lines(), "\n"))
	}
	m.Wait()
	var boots []string
	for _, l := range m.Lines() {
		if strings.HasPrefix(l, "boot ") {
			boots = append(boots, l)
		}
	}
	if !slices.Equal(boots, []string{"boot 1", "boot 2", "boot 3"}) || m.Restarts() != 2 {
		t.Errorf("boots %q, restarts %d; want three boots, two restarts", boots, m.Restarts())
	}
}

// A guest that hangs silently on its first start: PowerCycle kills that QEMU and starts another
// on the same disk, whose console goes on in the same Machine; a snapshot machine refuses.
func TestPowerCycle(t *testing.T) {
	img, qemu := standIn(t, "", `1) exec sleep 600 ;;
*) echo "[   1.0] reboot: Power down" ;;
`)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m, err := Start(ctx, Config{Image: img, Accel: "tcg", QEMU: qemu, WorkDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Stop()
	if _, err := m.WaitFor(ctx, regexp.MustCompile(`^boot 1$`)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if q := m.Quiet(); q < 300*time.Millisecond {
		t.Errorf("Quiet() = %s after 300ms of silence", q)
	}
	if err := m.PowerCycle(); err != nil {
		t.Fatal(err)
	}
	if _, err := m.WaitFor(ctx, regexp.MustCompile(`reboot: Power down`)); err != nil {
		t.Fatalf("%v\n%s", err, strings.Join(m.Lines(), "\n"))
	}
	if err := m.Wait(); err != nil {
		t.Errorf("the second QEMU: %v", err)
	}
	if got := strings.Join(m.Lines(), "|"); got != "boot 1|boot 2|[   1.0] reboot: Power down" || m.Restarts() != 1 {
		t.Errorf("console %q, restarts %d; want both boots in one console, one restart", got, m.Restarts())
	}
	if err := m.PowerCycle(); err == nil {
		t.Error("PowerCycle of an exited machine: no error")
	}

	s, err := Start(ctx, Config{Image: img, Accel: "tcg", QEMU: qemu, WorkDir: t.TempDir(), Snapshot: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	if err := s.PowerCycle(); err == nil || !strings.Contains(err.Error(), "snapshot") {
		t.Errorf("PowerCycle of a snapshot machine: %v, want a refusal naming the snapshot", err)
	}
}
