package testkit

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// requireToolsEnv names the environment variable that turns a missing tool from a skipped
// test into a failed one, for a machine that is meant to have them all.
const requireToolsEnv = "KILN_REQUIRE_TOOLS"

// Tool returns the path of the program name, looked up in $PATH and then in /usr/sbin and
// /sbin (not always in a user's $PATH). When it is missing the test is skipped, saying
// which Debian package has it (pkg, if known), or fails when $KILN_REQUIRE_TOOLS is set.
func Tool(t testing.TB, name, pkg string) string {
	t.Helper()
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	for _, dir := range []string{"/usr/sbin", "/sbin"} {
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p
		}
	}
	msg := name + " not installed"
	if pkg != "" {
		msg += " (Debian package " + pkg + ")"
	}
	if os.Getenv(requireToolsEnv) != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// Tools calls Tool for each name.
func Tools(t testing.TB, names ...string) {
	t.Helper()
	for _, n := range names {
		Tool(t, n, "")
	}
}

// RequireRoot skips the test unless it runs as root; why says what needs root.
func RequireRoot(t testing.TB, why string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: " + why)
	}
}

// Run runs name with args and returns its standard output and error; it fails the test,
// showing them, if the command fails.
func Run(t testing.TB, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// E2ECache is where qemu-tests/e2e/build-components.sh keeps what it builds:
// $KILN_E2E_CACHE, else $XDG_CACHE_HOME/kiln/e2e, else ~/.cache/kiln/e2e (the script's own
// default).
func E2ECache() string {
	if d := os.Getenv("KILN_E2E_CACHE"); d != "" {
		return d
	}
	if d := os.Getenv("XDG_CACHE_HOME"); d != "" {
		return filepath.Join(d, "kiln", "e2e")
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".cache", "kiln", "e2e")
}

// Component returns the path of a binary build-components.sh built from the version the
// profiles pin (E2ECache()/bin/name), such as etcd. When it is missing the test is skipped,
// saying how to build it (build-components.sh group), or fails when $KILN_REQUIRE_TOOLS is
// set.
func Component(t testing.TB, name, group string) string {
	t.Helper()
	p := filepath.Join(E2ECache(), "bin", name)
	if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
		return p
	}
	msg := p + " not built (qemu-tests/e2e/build-components.sh " + group + ")"
	if os.Getenv(requireToolsEnv) != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}
