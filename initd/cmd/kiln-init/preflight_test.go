package main

import (
	"strings"
	"testing"

	"github.com/kilnproject/kiln/internal/exitcode"
)

func TestPreflight(t *testing.T) {
	tests := []struct {
		args    []string
		wantErr string
		wantOut string
	}{
		{[]string{}, "--role is required", ""},
		{[]string{"--role", "master"}, `unknown role "master"`, ""},
		{[]string{"--role", "worker", "-o", "yaml"}, `unknown output format "yaml"`, ""},
		{[]string{"--role", "worker", "extra"}, `unexpected argument "extra"`, ""},
		{[]string{"-h"}, "", "Usage:\n  kiln-init preflight"},
		// "all" ignored: whatever this machine is, the command succeeds and prints JSON.
		{[]string{"--role=etcd", "-o", "json", "--ignore", "all", "--skip", "cri-socket"}, "", `"role": "etcd"`},
		{[]string{"--role=worker", "--ignore=all"}, "", "CHECK  "},
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			code, out, errOut := runCLI(t, append([]string{"preflight"}, tc.args...)...)
			if tc.wantErr == "" && code != 0 || tc.wantErr != "" && (code != exitcode.BadUsage || !strings.Contains(errOut, tc.wantErr)) {
				t.Fatalf("exit %d, stderr %q, want %q", code, errOut, tc.wantErr)
			}
			if !strings.Contains(out, tc.wantOut) {
				t.Errorf("output lacks %q:\n%s", tc.wantOut, out)
			}
		})
	}
}
