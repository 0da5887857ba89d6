package vm

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// ProbeKVM against a missing /dev/kvm or a kernel that cannot boot must say KVM is unusable,
// never hang past its bound.
func TestProbeKVMFailsBounded(t *testing.T) {
	bogus := filepath.Join(t.TempDir(), "vmlinuz")
	if err := os.WriteFile(bogus, []byte("not a kernel"), 0o600); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err := ProbeKVM(context.Background(), bogus, 5*time.Second)
	if err == nil {
		t.Fatal("ProbeKVM with a file that is not a kernel succeeded")
	}
	if d := time.Since(start); d > time.Minute { // a bound far past 5 s: a slow machine is no hang
		t.Fatalf("ProbeKVM took %s, past its bound", d)
	}
}

func TestChooseAccel(t *testing.T) {
	for _, tc := range []struct {
		want, env, got string
		err            bool
	}{
		{want: "tcg", got: "tcg"},
		{want: "kvm", got: "kvm"},
		{env: "tcg", got: "tcg"},
		{want: "xen", err: true},
	} {
		t.Setenv("KILN_ACCEL", tc.env)
		got, _, err := ChooseAccel(context.Background(), tc.want, "")
		if (err != nil) != tc.err || got != tc.got {
			t.Errorf("ChooseAccel(%q) env %q = %q, %v; want %q (error %v)", tc.want, tc.env, got, err, tc.got, tc.err)
		}
	}
}
