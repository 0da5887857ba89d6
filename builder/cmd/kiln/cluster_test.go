package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kilnproject/kiln/initd/config"
)

func TestClusterInit(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "demo")
	out, err := kiln(t, "cluster", "init", "--name", "demo", "--dns-zone", "k8s.example.com", "--control-planes", "3",
		"--workers", "2", "--api-endpoint", "192.168.100.10:6443", "-o", dir)
	if err != nil {
		t.Fatalf("kiln cluster init: %v\n%s", err, out)
	}
	for _, want := range []string{"demo-cp-3.ign", "demo-worker-2.ign", "admin.conf"} {
		if !strings.Contains(out, want) {
			t.Errorf("output does not mention %s:\n%s", want, out)
		}
	}
	for _, n := range []string{"demo-cp-1", "demo-cp-2", "demo-cp-3", "demo-worker-1", "demo-worker-2"} {
		data, err := os.ReadFile(filepath.Join(dir, n+".ign"))
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := config.Parse(data)
		if err != nil {
			t.Fatalf("%s.ign: %v", n, err)
		}
		if err := cfg.Validate(); err != nil {
			t.Errorf("%s.ign: %v", n, err)
		}
	}
	// A second run refuses to overwrite the cluster's keys; --force replaces them.
	if _, err := kiln(t, "cluster", "init", "--name", "demo", "--dns-zone", "k8s.example.com", "-o", dir); err == nil || !strings.Contains(err.Error(), "--force") {
		t.Errorf("second init: %v, want a refusal naming --force", err)
	}
	if out, err := kiln(t, "cluster", "init", "--name", "demo", "--dns-zone", "k8s.example.com", "--force", "-o", dir); err != nil {
		t.Errorf("init --force: %v\n%s", err, out)
	}
	if _, err := os.Stat(filepath.Join(dir, "demo-cp-3.ign")); err == nil {
		t.Error("--force kept demo-cp-3.ign of the old cluster")
	}
}

func TestClusterInitErrors(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "out")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"cluster", "init", "--dns-zone", "z", "-o", dir}, `required flag(s) "name" not set`},
		{[]string{"cluster", "init", "--name", "demo", "-o", dir}, `required flag(s) "dns-zone" not set`},
		{[]string{"cluster", "init", "--name", "demo", "--dns-zone", "z"}, `required flag(s) "output" not set`},
		{[]string{"cluster", "init", "--name", "demo", "--dns-zone", "z", "--control-planes", "2", "-o", dir}, "--control-planes: 2"},
		{[]string{"cluster", "init", "--name", "demo", "--dns-zone", "z", "--service-cidr", "10.0.0.0/8", "-o", dir}, "--service-cidr: 10.0.0.0/8 is too large"},
		{[]string{"cluster", "init", "--name", "demo", "--dns-zone", "z", "--kubernetes-version", "1.37", "-o", dir}, "--kubernetes-version"},
	} {
		_, err := kiln(t, tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("kiln %s: %v, want an error containing %q", strings.Join(tc.args, " "), err, tc.want)
		}
	}
	if _, err := os.Stat(dir); err == nil {
		t.Error("a failed init left its output directory")
	}
	out, err := kiln(t, "cluster", "init", "--help")
	if err != nil || !strings.Contains(out, "Examples:") || !strings.Contains(out, "--etcd-disk-serial") {
		t.Errorf("kiln cluster init --help: %v\n%s", err, out)
	}
}
