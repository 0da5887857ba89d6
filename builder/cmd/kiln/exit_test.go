package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"github.com/kilnproject/kiln/internal/exitcode"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

// A wrong command line exits 2, for every verb; other errors exit 1.
func TestExitCodes(t *testing.T) {
	dir := t.TempDir()
	img := filepath.Join(dir, "node.raw")
	if err := os.WriteFile(img, make([]byte, 4096), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want int
	}{
		{nil, 0},
		{[]string{"--help"}, 0},
		{[]string{"cluster"}, 0},
		{[]string{"nosuch"}, exitcode.BadUsage},
		{[]string{"base", "nosuch"}, exitcode.BadUsage},
		{[]string{"cluster", "nosuch"}, exitcode.BadUsage},
		{[]string{"run"}, exitcode.BadUsage},
		{[]string{"run", img, img}, exitcode.BadUsage},
		{[]string{"inspect"}, exitcode.BadUsage},
		{[]string{"inspect", img, "-o", "yaml"}, exitcode.BadUsage},
		{[]string{"lock", "a.yaml", "b.yaml"}, exitcode.BadUsage},
		{[]string{"base", "import"}, exitcode.BadUsage},
		{[]string{"bake", "images/qemu.yaml"}, exitcode.BadUsage}, // --role is required
		{[]string{"run", img, "--disk", "etcd-main"}, exitcode.BadUsage},
		{[]string{"run", img, "--forward", "6443"}, exitcode.BadUsage},
		{[]string{"run", img, "--until", "("}, exitcode.BadUsage},
		{[]string{"run", img, "--memory", "lots"}, exitcode.BadUsage},
		{[]string{"inspect", filepath.Join(dir, "missing.raw")}, exitcode.Failure},
		{[]string{"run", img, "--accel", "xen"}, exitcode.Failure},
	} {
		var stderr bytes.Buffer
		root := newRoot()
		root.SetOut(&bytes.Buffer{})
		if got := execute(context.Background(), root, tc.args, &stderr); got != tc.want {
			t.Errorf("kiln %s: exit %d, want %d (%s)", strings.Join(tc.args, " "), got, tc.want, stderr.String())
		}
	}
}

// An unknown flag is a usage error on every command.
func TestUnknownFlagIsUsageError(t *testing.T) {
	var walk func(c *cobra.Command, path []string)
	walk = func(c *cobra.Command, path []string) {
		args := append(append([]string{}, path...), "--no-such-flag")
		var stderr bytes.Buffer
		root := newRoot()
		root.SetOut(&bytes.Buffer{})
		if got := execute(context.Background(), root, args, &stderr); got != exitcode.BadUsage {
			t.Errorf("kiln %s: exit %d, want %d (%s)", strings.Join(args, " "), got, exitcode.BadUsage, stderr.String())
		}
		if !strings.Contains(stderr.String(), "--help' for usage") {
			t.Errorf("kiln %s: stderr %q does not point to --help", strings.Join(args, " "), stderr.String())
		}
		for _, sub := range c.Commands() {
			walk(sub, append(append([]string{}, path...), sub.Name()))
		}
	}
	walk(newRoot(), nil)
}

// fakeConsole prints lines, then blocks until the context ends.
type fakeConsole struct{ lines []string }

func (f fakeConsole) WaitFor(ctx context.Context, re *regexp.Regexp) (string, error) {
	for _, l := range f.lines {
		if re.MatchString(l) {
			return l, nil
		}
	}
	<-ctx.Done()
	return "", fmt.Errorf("waiting for %q: %w", re, ctx.Err())
}

func (f fakeConsole) Wait() error { return nil }

// --until-firstboot ends by the status line: ok and done already succeed, failed is an error
// (exit 1), no line within --timeout is exit 3.
func TestRunWaitStatusLine(t *testing.T) {
	for _, tc := range []struct {
		name  string
		lines []string
		until string
		want  int
	}{
		{"ok", []string{"booting", nodeimage.FormatOK("fw_cfg", 1, "tasks=1 applied=1 unchanged=0 failed=0", time.Second)}, "", 0},
		{"done", []string{nodeimage.FormatDone(time.Unix(0, 0))}, "", 0},
		{"failed", []string{nodeimage.FormatFailed("task etcd: no volume")}, "", exitcode.Failure},
		{"timeout", []string{"booting"}, "", exitcode.TimedOut},
		{"until timeout", []string{"booting"}, "ready", exitcode.TimedOut},
		{"until", []string{"ready"}, "ready", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := runOptions{untilBoot: tc.until == ""}
			var re *regexp.Regexp
			if tc.until != "" {
				re = regexp.MustCompile(tc.until)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			defer cancel()
			err := o.wait(ctx, fakeConsole{tc.lines}, re, 50*time.Millisecond)
			if got := exitcode.Of(err); got != tc.want {
				t.Errorf("exit %d (%v), want %d", got, err, tc.want)
			}
		})
	}
}
