package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The verbs after up, on a state directory without a cluster, and up's refusals: each says
// what to do. (Booting is make e2e-ha's.)
func TestClusterUpVerbsErrors(t *testing.T) {
	empty := t.TempDir()
	keys := t.TempDir()
	os.WriteFile(filepath.Join(keys, "id"), []byte("-----BEGIN OPENSSH PRIVATE KEY-----\nb3Blbn\n-----END OPENSSH PRIVATE KEY-----\n"), 0o600)
	os.WriteFile(filepath.Join(keys, "junk.pub"), []byte("# mine\nssh-ed25519 not-base64 me@host\n"), 0o644)
	os.WriteFile(filepath.Join(keys, "empty.pub"), []byte("# nothing\n\n"), 0o644)
	tests := []struct {
		name string
		args []string
		want []string
	}{
		{"status without a cluster", []string{"cluster", "status", "--state-dir", empty}, []string{"no cluster", "kiln cluster up"}},
		{"status without --name", []string{"cluster", "status"}, []string{"--name or --state-dir"}},
		{"stop without a cluster", []string{"cluster", "stop", "x-cp-1", "--state-dir", empty}, []string{"no cluster"}},
		{"down without a cluster", []string{"cluster", "down", "--state-dir", empty}, []string{"no cluster"}},
		{"up with two control planes", []string{"cluster", "up", "--name", "demo", "--control-planes", "2", "--accel", "tcg", "--state-dir", filepath.Join(empty, "a")},
			[]string{"--control-planes 2"}},
		{"up without images", []string{"cluster", "up", "--name", "demo", "--accel", "tcg", "--image-dir", empty, "--state-dir", filepath.Join(empty, "b")},
			[]string{"no control-plane image", "kiln bake"}},
		{"up with a private key as --ssh-key", []string{"cluster", "up", "--name", "demo", "--accel", "tcg", "--ssh-key", filepath.Join(keys, "id"), "--state-dir", filepath.Join(empty, "d")},
			[]string{"id:1: a private key; give the public one"}},
		{"up with a malformed key", []string{"cluster", "up", "--name", "demo", "--accel", "tcg", "--ssh-key", filepath.Join(keys, "junk.pub"), "--state-dir", filepath.Join(empty, "e")},
			[]string{"junk.pub:2: not a public key"}},
		{"up with a key file without keys", []string{"cluster", "up", "--name", "demo", "--accel", "tcg", "--ssh-key", filepath.Join(keys, "empty.pub"), "--state-dir", filepath.Join(empty, "f")},
			[]string{"empty.pub: no public key"}},
		{"up with a bad accelerator", []string{"cluster", "up", "--name", "demo", "--accel", "xen", "--state-dir", filepath.Join(empty, "c")},
			[]string{`--accel "xen"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := kiln(t, tt.args...)
			for _, w := range tt.want {
				if err == nil || !strings.Contains(err.Error(), w) {
					t.Errorf("kiln %s: %v (%s), want an error saying %q", strings.Join(tt.args, " "), err, out, w)
				}
			}
		})
	}
	if entries, _ := os.ReadDir(empty); len(entries) != 0 {
		t.Errorf("refused commands left %d entries in %s", len(entries), empty)
	}
}

func TestClusterVerbsHelp(t *testing.T) {
	for _, verb := range []string{"init", "up", "status", "stop", "start", "replace", "down"} {
		out, err := kiln(t, "cluster", verb, "--help")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out, "Examples:") {
			t.Errorf("kiln cluster %s --help has no examples:\n%s", verb, out)
		}
	}
	// up says which DNS it uses and why.
	out, _ := kiln(t, "cluster", "up", "--help")
	if !strings.Contains(out, "hosts provider") || !strings.Contains(out, "port 53") {
		t.Errorf("kiln cluster up --help does not say which DNS and why:\n%s", out)
	}
}
