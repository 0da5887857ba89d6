package task

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kilnproject/kiln/internal/testkit"
)

// The tasks below are written the way first-boot tasks are meant to be: the check
// compares the desired state with what is on disk, the apply writes it (a file is
// created under a temporary name with its final mode and renamed into place).

func dirTask(root, name, rel string, mode fs.FileMode, deps ...string) Task {
	p := filepath.Join(root, rel)
	return Func(name, deps,
		func(context.Context) (bool, error) {
			fi, err := os.Stat(p)
			if errors.Is(err, fs.ErrNotExist) {
				return false, nil
			}
			if err != nil {
				return false, err
			}
			return fi.IsDir() && fi.Mode().Perm() == mode, nil
		},
		func(context.Context) error {
			if err := os.MkdirAll(p, mode); err != nil {
				return err
			}
			return os.Chmod(p, mode)
		})
}

func fileTask(root, name, rel, contents string, mode fs.FileMode, deps ...string) Task {
	p := filepath.Join(root, rel)
	return Func(name, deps,
		func(context.Context) (bool, error) {
			fi, err := os.Lstat(p)
			if errors.Is(err, fs.ErrNotExist) {
				return false, nil
			}
			if err != nil {
				return false, err
			}
			if !fi.Mode().IsRegular() || fi.Mode().Perm() != mode {
				return false, nil
			}
			cur, err := os.ReadFile(p)
			return err == nil && bytes.Equal(cur, []byte(contents)), err
		},
		func(context.Context) error {
			tmp := p + ".kiln-tmp"
			f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
			if err != nil {
				return err
			}
			_, werr := f.WriteString(contents)
			if err := errors.Join(werr, f.Sync(), f.Close()); err != nil {
				os.Remove(tmp)
				return fmt.Errorf("write %s: %w", rel, err)
			}
			return os.Rename(tmp, p)
		})
}

func linkTask(root, name, rel, target string, deps ...string) Task {
	p := filepath.Join(root, rel)
	return Func(name, deps,
		func(context.Context) (bool, error) {
			cur, err := os.Readlink(p)
			if errors.Is(err, fs.ErrNotExist) {
				return false, nil
			}
			return cur == target, nil
		},
		func(context.Context) error {
			if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return err
			}
			return os.Symlink(target, p)
		})
}

func nodeTasks(root string) []Task {
	return []Task{
		dirTask(root, "etc", "etc", 0o755),
		dirTask(root, "manifests-dir", "etc/kubernetes/manifests", 0o755, "etc"),
		dirTask(root, "pki-dir", "etc/kubernetes/pki", 0o700, "etc"),
		fileTask(root, "hostname", "etc/hostname", "cp-1\n", 0o644, "etc"),
		fileTask(root, "kubelet-config", "etc/kubernetes/kubelet.yaml", "kind: KubeletConfiguration\n", 0o644, "manifests-dir"),
		fileTask(root, "etcd-manifest", "etc/kubernetes/manifests/etcd.yaml", "kind: Pod\n", 0o600, "manifests-dir"),
		fileTask(root, "ca-key", "etc/kubernetes/pki/ca.key", "-----BEGIN PRIVATE KEY-----\n", 0o600, "pki-dir"),
		linkTask(root, "resolv", "etc/resolv.conf", "../run/systemd/resolve/stub-resolv.conf", "etc"),
	}
}

// untouched reports whether a node kept its content, mode and modification time.
func untouched(a, b testkit.Node) bool {
	return testkit.SameContent(a, b) && a.MTime.Equal(b.MTime)
}

// rerunCase is a drift between two runs over the same node, and what the second run does about it.
type rerunCase struct {
	name    string
	drift   func(root string) error // what happens to the node between runs
	touched []string                // entries the drift and its repair may re-time
	applied []string                // tasks the second run applies
}

var rerunCases = []rerunCase{
	{name: "untouched node"},
	{
		name: "edited file is restored",
		drift: func(root string) error {
			return os.WriteFile(filepath.Join(root, "etc/hostname"), []byte("oops\n"), 0o644)
		},
		touched: []string{"etc", "etc/hostname"},
		applied: []string{"hostname"},
	},
	{
		name:    "loosened secret is rewritten",
		drift:   func(root string) error { return os.Chmod(filepath.Join(root, "etc/kubernetes/pki/ca.key"), 0o644) },
		touched: []string{"etc/kubernetes/pki", "etc/kubernetes/pki/ca.key"},
		applied: []string{"ca-key"},
	},
	{
		name:    "removed link is recreated",
		drift:   func(root string) error { return os.Remove(filepath.Join(root, "etc/resolv.conf")) },
		touched: []string{"etc", "etc/resolv.conf"},
		applied: []string{"resolv"},
	},
}

func TestRerunChangesNothing(t *testing.T) {
	for _, tc := range rerunCases {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			rep, err := Run(context.Background(), nodeTasks(root), Options{})
			if err != nil {
				t.Fatal(err)
			}
			if rep.Changed != len(rep.Tasks) {
				t.Fatalf("first run: %s, want every task applied", rep.Summary())
			}
			first := testkit.Snapshot(t, root)
			if e := first["etc/kubernetes/pki/ca.key"]; e.Mode.Perm() != 0o600 {
				t.Fatalf("ca.key mode %s, want 0600", e.Mode)
			}

			// Let the clock move on, so that anything rewritten gets a new mtime.
			time.Sleep(20 * time.Millisecond)
			if tc.drift != nil {
				if err := tc.drift(root); err != nil {
					t.Fatal(err)
				}
			}
			rep, err = Run(context.Background(), nodeTasks(root), Options{})
			if err != nil {
				t.Fatal(err)
			}
			var applied []string
			for _, s := range rep.Tasks {
				if s.State == StateApplied {
					applied = append(applied, s.Name)
				}
			}
			if strings.Join(applied, " ") != strings.Join(tc.applied, " ") {
				t.Errorf("second run applied %q, want %q (%s)", applied, tc.applied, rep.Summary())
			}
			second := testkit.Snapshot(t, root)
			if d := first.Diff(second, testkit.SameContent); len(d) > 0 {
				t.Errorf("second run left different contents or modes:\n%s", strings.Join(d, "\n"))
			}
			for _, p := range tc.touched {
				delete(first, p)
				delete(second, p)
			}
			if d := first.Diff(second, untouched); len(d) > 0 {
				t.Errorf("second run touched entries it had no reason to:\n%s", strings.Join(d, "\n"))
			}

			// A third run finds nothing at all to do.
			before := testkit.Snapshot(t, root)
			time.Sleep(20 * time.Millisecond)
			rep, err = Run(context.Background(), nodeTasks(root), Options{})
			if err != nil || rep.Changed != 0 {
				t.Errorf("third run: %s, %v; want nothing applied", rep.Summary(), err)
			}
			if d := before.Diff(testkit.Snapshot(t, root), untouched); len(d) > 0 {
				t.Errorf("third run changed:\n%s", strings.Join(d, "\n"))
			}
		})
	}
}
