package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kilnproject/kiln/initd/firstboot"
	"github.com/kilnproject/kiln/initd/stage1"
	"github.com/kilnproject/kiln/initd/task"
	"github.com/kilnproject/kiln/internal/exitcode"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

// runCLI runs kiln-init with args and returns its exit code, stdout and stderr.
func runCLI(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(context.Background(), args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// statusRoot is a node root whose first boot left a status file.
func statusRoot(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	st := firstboot.Status{State: firstboot.StateOK, Source: "fw_cfg", Version: "v1", Files: []firstboot.FileStatus{},
		Tasks: []task.TaskStatus{{Name: "users", State: task.StateApplied, Attempts: 1}}}
	data, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(root, nodeimage.StatusPath)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return root
}

// Every verb's --help exits 0 and shows its examples; the root's shows the exit codes.
func TestHelp(t *testing.T) {
	for _, verb := range [][]string{{}, {"firstboot"}, {"status"}, {"dns"}, {"preflight"}, {"version"},
		{"kube"}, {"kube", "images"}, {"kube", "cni"}, {"kube", "bootstrap"}} {
		args := append(append([]string{}, verb...), "--help")
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			code, out, errOut := runCLI(t, args...)
			if code != 0 {
				t.Fatalf("exit %d, want 0; stderr:\n%s", code, errOut)
			}
			want := strings.TrimSpace("kiln-init " + strings.Join(verb, " "))
			if !strings.Contains(out, "Examples:\n  "+want) {
				t.Errorf("help lacks an example of %q:\n%s", want, out)
			}
			if len(verb) == 0 && !strings.Contains(out, "3  timeout") {
				t.Errorf("help lacks the exit codes:\n%s", out)
			}
		})
	}
}

// Exit codes: 2 for a wrong command line, 1 for a failure, 0 for success.
func TestExitCodes(t *testing.T) {
	root := statusRoot(t)
	tests := []struct {
		args    []string
		code    int
		wantErr string
	}{
		{nil, exitcode.BadUsage, "missing verb"},
		{[]string{"frobnicate"}, exitcode.BadUsage, `unknown verb "frobnicate"`},
		{[]string{"status", "--frob"}, exitcode.BadUsage, "unknown flag: --frob"},
		{[]string{"status", "extra"}, exitcode.BadUsage, `unexpected argument "extra"`},
		{[]string{"status", "--root", root, "-o", "yaml"}, exitcode.BadUsage, `unknown output format "yaml"`},
		{[]string{"kube"}, exitcode.BadUsage, "missing verb"},
		{[]string{"kube", "frob"}, exitcode.BadUsage, `unknown verb "frob"`},
		{[]string{"kube", "images", "--for-kubelet", "--after-api"}, exitcode.BadUsage, "exclude each other"},
		{[]string{"kube", "cni", "--wait", "soon"}, exitcode.BadUsage, "invalid argument"},
		{[]string{"status", "--root", t.TempDir()}, exitcode.Failure, "first boot has not run"},
		{[]string{"kube", "bootstrap", "--root", t.TempDir()}, exitcode.Failure, "node.yaml"},
		{[]string{"update"}, exitcode.BadUsage, "--from is required"},
		{[]string{"update", "--from", "http://h/qemu-worker.json", "--tries", "0"}, exitcode.BadUsage, "--tries 0: want 1 to 9"},
		{[]string{"update", "--from", "ftp://h/qemu-worker.json"}, exitcode.BadUsage, "scheme not supported"},
		{[]string{"update", "--from", "/var/tmp/qemu-worker.raw"}, exitcode.BadUsage, "want the bake's <image>-<role>.json"},
		{[]string{"update", "status", "-o", "yaml"}, exitcode.BadUsage, `unknown output format "yaml"`},
		{[]string{"status", "--root", root}, 0, ""},
		{[]string{"version"}, 0, ""},
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			code, _, errOut := runCLI(t, tc.args...)
			if code != tc.code || !strings.Contains(errOut, tc.wantErr) {
				t.Errorf("exit %d, stderr %q; want exit %d saying %q", code, errOut, tc.code, tc.wantErr)
			}
		})
	}
}

// A run that gave up waiting exits 3, a failed one 1, whatever wraps the error.
func TestExitCode(t *testing.T) {
	for _, tc := range []struct {
		err  error
		code int
	}{
		{nil, 0},
		{errors.New("task files failed"), exitcode.Failure},
		{task.TimedOut(errors.New("no pod CIDR after 15m")), exitcode.TimedOut},
		{fmt.Errorf("first boot: %w", context.DeadlineExceeded), exitcode.TimedOut},
		{context.Canceled, exitcode.Failure},
		{fmt.Errorf("status: %w", exitcode.Usagef("-o: unknown output format")), exitcode.BadUsage},
	} {
		if got := exitcode.Of(tc.err); got != tc.code {
			t.Errorf("exitcode.Of(%v) = %d, want %d", tc.err, got, tc.code)
		}
	}
}

// status -o json prints the first-boot report as data.
func TestStatusJSON(t *testing.T) {
	root := statusRoot(t)
	for _, args := range [][]string{{"-o", "json"}, {"--output=json"}} {
		code, out, errOut := runCLI(t, append([]string{"status", "--root", root}, args...)...)
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, errOut)
		}
		var st firstboot.Status
		if err := json.Unmarshal([]byte(out), &st); err != nil {
			t.Fatalf("%v: output is not JSON: %v\n%s", args, err, out)
		}
		if st.State != firstboot.StateOK || len(st.Tasks) != 1 || st.Tasks[0].Name != "users" {
			t.Errorf("%v: status %+v", args, st)
		}
	}
	code, out, _ := runCLI(t, "status", "--root", root)
	if code != 0 || !strings.Contains(out, "fw_cfg") {
		t.Errorf("status table: exit %d\n%s", code, out)
	}
}

func TestVersion(t *testing.T) {
	for _, args := range [][]string{{"version"}, {"--version"}} {
		if code, out, _ := runCLI(t, args...); code != 0 || out != version+"\n" {
			t.Errorf("%v: exit %d, %q, want %q", args, code, out, version+"\n")
		}
	}
}

// status shows how stage 1 booted the node when it recorded it.
func TestStatusShowsBoot(t *testing.T) {
	root := statusRoot(t)
	if _, out, _ := runCLI(t, "status", "--root", root); strings.Contains(out, "Boot ") {
		t.Errorf("a Boot line without a record:\n%s", out)
	}
	rec := `{"mode":"live","rootDevice":"/dev/loop0","rootURL":"http://10.0.2.2:8080/w/rootfs.img","rootSHA256":"ab12",` +
		`"varDevice":"tmpfs","varKind":"tmpfs","varWhy":"no blank disk: /var is in RAM and is lost at reboot","link":"eth0","address":"10.0.2.15/24"}`
	p := filepath.Join(root, stage1.BootInfoPath)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(rec), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, _ := runCLI(t, "status", "--root", root)
	want := "\nBoot live: root /dev/loop0 (http://10.0.2.2:8080/w/rootfs.img, sha256 ab12) not verified, /var on tmpfs (tmpfs), network eth0 10.0.2.15/24\n"
	if code != 0 || !strings.Contains(out, want) {
		t.Errorf("status: exit %d, want %q in\n%s", code, want, out)
	}
}
