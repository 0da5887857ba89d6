package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func kiln(t *testing.T, args ...string) (string, error) {
	t.Helper()
	root := newRoot()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	err := root.Execute()
	return out.String(), err
}

// Mistakes on the command line are reported before anything boots or bakes.
func TestCommandLineErrors(t *testing.T) {
	dir := t.TempDir()
	img := filepath.Join(dir, "node.raw")
	os.WriteFile(img, make([]byte, 4096), 0o644)
	bu := filepath.Join(dir, "node.bu")
	os.WriteFile(bu, []byte("variant: fcos\nversion: 1.6.0\nstorage:\n  luks:\n    - name: x\n      device: /dev/vdb\n      clevis:\n        tpm2: true\n"), 0o644)
	bad := filepath.Join(dir, "bad.bu")
	os.WriteFile(bad, []byte("variant: fcos\nversion: 1.6.0\nstorage:\n  filez: []\n"), 0o644)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"bake", "images/qemu.yaml"}, `required flag(s) "role" not set`},
		{[]string{"bake", "images/qemu.yaml", "--role", "worker", "--cache-repo", "registry.example.com/Team/Cache"}, `--cache-repo: cache repository "registry.example.com/Team/Cache"`},
		{[]string{"run", img, "--disk", "etcd-main"}, "want NAME=SIZE or NAME=FILE"},
		{[]string{"run", img, "--config", bu, "--accel", "tcg"}, "storage.luks[0].clevis: clevis (tang, tpm2) is not supported: give a keyFile"},
		{[]string{"run", img, "--config", bad, "--accel", "tcg"}, "filez"},
		{[]string{"run", img, "--accel", "xen"}, `accelerator "xen"`},
		{[]string{"run", img, "--until", "(", "--accel", "tcg"}, "--until"},
		{[]string{"base", "import", filepath.Join(dir, "missing.tar"), "--layout", dir, "--tag", "x"}, "missing.tar"},
	} {
		_, err := kiln(t, tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("kiln %s: %v, want an error containing %q", strings.Join(tc.args, " "), err, tc.want)
		}
	}
}

// Every verb documents itself with examples.
func TestHelpHasExamples(t *testing.T) {
	for _, verb := range []string{"bake", "lock", "run", "inspect", "base", "serve", "check-config", "iso add-config", "cache prune"} {
		out, err := kiln(t, append(strings.Fields(verb), "--help")...)
		if err != nil {
			t.Fatal(err)
		}
		if verb != "base" && !strings.Contains(out, "Examples:") {
			t.Errorf("kiln %s --help has no examples:\n%s", verb, out)
		}
	}
}
