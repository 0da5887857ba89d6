package stage1

import "testing"

// Stage 1 runs only as the initramfs' /init (kiln-stage1 refuses to run elsewhere): a container that runs kiln-init as its PID 1
// (the controller-manager's wait-api init container) gets the command line.
func TestIsInitramfsInit(t *testing.T) {
	for _, tc := range []struct {
		pid   int
		argv0 string
		want  bool
	}{
		{1, "/init", true},
		{1, "init", true},
		{1, "/usr/local/bin/kiln-init", false},
		{1, "kiln-init", false},
		{4242, "/init", false},
		{4242, "/usr/bin/kiln-init", false},
	} {
		if got := IsInitramfsInit(tc.pid, tc.argv0); got != tc.want {
			t.Errorf("IsInitramfsInit(%d, %q) = %v, want %v", tc.pid, tc.argv0, got, tc.want)
		}
	}
}
