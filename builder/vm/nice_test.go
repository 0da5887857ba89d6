package vm

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// fakeQEMU writes a stand-in for qemu-system-x86_64 that prints its own niceness (field 19 of
// /proc/self/stat, read by its child awk through the parent's pid) and exits.
func fakeQEMU(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "qemu-system-x86_64")
	script := "#!/bin/sh\nawk '{print \"nice=\" $19}' /proc/$$/stat\n"
	if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestStartNice(t *testing.T) {
	if _, _, err := Firmware(); err != nil {
		t.Skip(err)
	}
	img := filepath.Join(t.TempDir(), "disk.raw")
	if err := os.WriteFile(img, make([]byte, 4096), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		nice int
		want string
	}{
		{0, "nice=0"},
		{10, "nice=10"},
		{19, "nice=19"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		m, err := Start(ctx, Config{Image: img, Accel: "tcg", QEMU: fakeQEMU(t), Nice: tc.nice, WorkDir: t.TempDir()})
		if err != nil {
			cancel()
			t.Fatalf("nice %d: %v", tc.nice, err)
		}
		line, err := m.WaitFor(ctx, regexp.MustCompile(`^nice=`))
		m.Stop()
		cancel()
		if err != nil {
			t.Fatalf("nice %d: %v", tc.nice, err)
		}
		if strings.TrimSpace(line) != tc.want {
			t.Errorf("nice %d: QEMU ran with %q, want %q", tc.nice, line, tc.want)
		}
	}
	for _, bad := range []int{-1, 20} {
		_, err := Start(context.Background(), Config{Image: img, Accel: "tcg", QEMU: fakeQEMU(t), Nice: bad, WorkDir: t.TempDir()})
		if err == nil || !strings.Contains(err.Error(), "nice") {
			t.Errorf("nice %d: err = %v, want an error naming nice", bad, err)
		}
	}
}
