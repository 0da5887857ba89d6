// Package qemutests boots baked kiln images under QEMU (TCG) and checks what a user would see:
// the serial console, and the disk afterwards, read with the real e2fsprogs.
//
// The tests need the default base OS (`make base`) and a static kiln-init (`make build`); `make
// test` provides both and sets KILN_QEMU_TESTS=1, which turns a missing prerequisite into a
// failure instead of a skip.
package qemutests

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	diskfs "github.com/diskfs/go-diskfs"

	"github.com/kilnproject/kiln/builder/vm"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

// repoRoot is the repository checkout these tests run in.
func repoRoot(t *testing.T) string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(filepath.Dir(file))
}

// require skips (or, under `make test`, fails) when a prerequisite is missing.
func require(t *testing.T, ok bool, format string, a ...any) {
	t.Helper()
	if ok {
		return
	}
	msg := fmt.Sprintf(format, a...)
	if os.Getenv("KILN_QEMU_TESTS") == "1" {
		t.Fatal(msg)
	}
	t.Skip(msg + " (make test provides it)")
}

// env is what one test needs: the kiln binary, a kiln-init, a copy of the repository's
// definitions and a cache, so the test never writes into the checkout.
type env struct {
	t       *testing.T
	dir     string
	kiln    string
	repo    string
	environ []string
}

// newEnv is the smoke tests' environment: a copy of the repository whose roles' profiles
// are the Kubernetes-free ones in testdata/profiles (Kubernetes is built from source for
// make e2e only).
func newEnv(t *testing.T) *env {
	t.Helper()
	e := newRepoEnv(t)
	e.run(repoRoot(t), "cp", "-a", filepath.Join(repoRoot(t), "qemu-tests", "testdata", "profiles")+"/.", filepath.Join(e.repo, "profiles"))
	return e
}

// newRepoEnv is an environment whose repository copy keeps the real profiles (the e2e).
func newRepoEnv(t *testing.T) *env {
	t.Helper()
	if testing.Short() {
		t.Skip("QEMU boot tests are not short")
	}
	_, err := exec.LookPath("qemu-system-x86_64")
	require(t, err == nil, "qemu-system-x86_64 not installed")
	cache := os.Getenv("KILN_CACHE")
	if cache == "" {
		home, _ := os.UserHomeDir()
		cache = filepath.Join(home, ".cache", "kiln")
	}
	_, err = os.Stat(filepath.Join(cache, "base", "index.json"))
	require(t, err == nil, "no base OS image in %s/base", cache)
	init := os.Getenv("KILN_INIT")
	require(t, init != "", "KILN_INIT does not name a static kiln-init")
	stage1 := filepath.Join(filepath.Dir(init), "kiln-stage1")
	_, err = os.Stat(stage1)
	require(t, err == nil, "no kiln-stage1 beside KILN_INIT %s (make build writes both)", init)
	root := repoRoot(t)
	dir := t.TempDir()
	e := &env{t: t, dir: dir, kiln: filepath.Join(dir, "kiln"), repo: filepath.Join(dir, "repo")}
	e.environ = append(os.Environ(), "KILN_CACHE="+cache, "KILN_INIT="+init, "KILN_STAGE1="+stage1, "KILN_ACCEL=tcg")
	e.run(root, "go", "build", "-o", e.kiln, "./builder/cmd/kiln")
	for _, d := range []string{"images", "profiles", "overlays"} {
		e.run(root, "cp", "-a", filepath.Join(root, d), filepath.Join(e.repo, d))
	}
	// Locks of definitions on the local base pin this machine's base; each test locks afresh.
	locks, _ := filepath.Glob(filepath.Join(e.repo, "images", "*.lock"))
	for _, l := range locks {
		os.Remove(l)
	}
	return e
}

func (e *env) run(dir, name string, args ...string) string {
	e.t.Helper()
	if name == "cp" {
		os.MkdirAll(filepath.Dir(args[len(args)-1]), 0o755)
	}
	cmd := exec.Command(name, args...)
	cmd.Dir, cmd.Env = dir, e.environ
	out, err := cmd.CombinedOutput()
	if err != nil {
		e.t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// bake locks and bakes images/<def>.yaml for role and returns the raw image's path.
func (e *env) bake(def, role string) string {
	e.t.Helper()
	return e.bakeInto(def, role, "out", def, "")
}

// bakeInto locks and bakes images/<def>.yaml for role into e.dir/<out>, with SOURCE_DATE_EPOCH
// epoch unless "", and more bake flags; it returns the raw image's path, named after the
// definition's name field.
func (e *env) bakeInto(def, role, out, name, epoch string, flags ...string) string {
	e.t.Helper()
	start := time.Now()
	if epoch != "" {
		environ := e.environ
		e.environ = append(append([]string(nil), environ...), "SOURCE_DATE_EPOCH="+epoch)
		defer func() { e.environ = environ }()
	}
	e.run(e.repo, e.kiln, "lock", "images/"+def+".yaml")
	e.run(e.repo, e.kiln, append([]string{"bake", "images/" + def + ".yaml", "--role", role, "-o", filepath.Join(e.dir, out)}, flags...)...)
	e.t.Logf("baked %s-%s in %s", def, role, time.Since(start).Round(time.Millisecond))
	return filepath.Join(e.dir, out, name+"-"+role+".raw")
}

// rootSize is the least size of a booted disk, as kiln run's default: a baked image is only as
// large as its partitions, and first boot gives the rest to /var.
const rootSize = "4G"

// boot starts QEMU (TCG) on image and waits for a console line matching want.
func (e *env) boot(image, config string, want *regexp.Regexp, timeout time.Duration) (*vm.Machine, string) {
	e.t.Helper()
	return e.bootWith(vm.Config{Image: image, Config: config}, want, timeout)
}

// bootWith boots cfg (TCG, console logged in the test's directory) and waits for want.
func (e *env) bootWith(cfg vm.Config, want *regexp.Regexp, timeout time.Duration) (*vm.Machine, string) {
	e.t.Helper()
	image := cfg.Image
	if image == "" {
		image = "diskless"
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	logf, err := os.Create(filepath.Join(e.logDir(), fmt.Sprintf("serial-%s-%d.log", strings.TrimSuffix(filepath.Base(image), filepath.Ext(image)), time.Now().UnixNano())))
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { logf.Close() })
	start := time.Now()
	// cfg.Serial, when given, sees the console too (e.g. to time its lines).
	serial := io.Writer(logf)
	if cfg.Serial != nil {
		serial = io.MultiWriter(logf, cfg.Serial)
	}
	// A guest reboot is a cold start: under TCG a warm reset of OVMF can hang QEMU.
	cfg.Accel, cfg.Serial, cfg.WorkDir, cfg.ColdReset = "tcg", serial, e.t.TempDir(), true
	if cfg.Image != "" && cfg.RootSize == "" {
		cfg.RootSize = rootSize
	}
	m, err := vm.Start(context.Background(), cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(m.Stop)
	frozen := watchFrozen(ctx, m, frozenAfter, e.t.Logf)
	line, err := waitUnstalled(ctx, m, want, stallGrace, e.t.Logf)
	if err != nil {
		m.Stop()
		lines := m.Lines()
		e.t.Fatalf("boot %s: %v%s\n%slast console lines:\n%s", filepath.Base(image), err, frozen(), stallReport(lines), tail(lines, 40))
	}
	e.t.Logf("console %q after %s", strings.TrimSpace(line), time.Since(start).Round(time.Millisecond))
	return m, line
}

// guestStall matches the guest kernel's report that a CPU or RCU's grace-period kthread made
// no progress for its stall timeout (21 s in Debian's kernels): the first line of an RCU
// stall or soft-lockup report.
var guestStall = regexp.MustCompile(`rcu: INFO: \S+ (self-)?detected stalls?|rcu: \S+ kthread starved for|watchdog: BUG: soft lockup`)

// stallGrace is how long a boot wait goes on after the guest kernel reported a stall. A guest
// whose vCPU threads were starved by the host recovers well within it; one that is still
// silent after it has hung (an interrupt lost in the emulator, a kernel deadlock), and waiting
// out the rest of a boot's timeout only delays the report.
const stallGrace = 3 * time.Minute

// console is the part of a *vm.Machine a boot wait reads.
type console interface {
	WaitFor(ctx context.Context, re *regexp.Regexp) (string, error)
}

// waitUnstalled waits for want on m's console like WaitFor, and if the guest kernel reports a
// stall first, for at most grace more (logged through logf).
func waitUnstalled(ctx context.Context, m console, want *regexp.Regexp, grace time.Duration, logf func(string, ...any)) (string, error) {
	either := regexp.MustCompile(`(?:` + want.String() + `)|(?:` + guestStall.String() + `)`)
	line, err := m.WaitFor(ctx, either)
	if err != nil || want.MatchString(line) {
		return line, err
	}
	logf("the guest kernel reports a stall (%q); waiting at most %s more for %q", strings.TrimSpace(line), grace, want)
	sctx, cancel := context.WithTimeout(ctx, grace)
	defer cancel()
	line, err = m.WaitFor(sctx, want)
	if err != nil {
		return "", fmt.Errorf("the guest kernel stalled and did not recover within %s: %w", grace, err)
	}
	return line, nil
}

// stallReport is the guest kernel's first stall report on the console (up to 30 lines from its
// first line) with a heading, or "" when there is none: the stalled CPU, the starved task and
// their stacks, which a boot's last lines no longer show once the report repeats.
func stallReport(lines []string) string {
	for i, l := range lines {
		if guestStall.MatchString(l) {
			end := min(i+30, len(lines))
			return "first stall report of the guest kernel:\n" + strings.Join(lines[i:end], "\n") + "\n"
		}
	}
	return ""
}

// frozenAfter is how long a console may stay silent before the harness calls QEMU frozen. A
// running guest kernel is never silent that long while a test waits on it: its hung-task
// detector reports a blocked task after 120 s (checked every 120 s), its RCU stall detector
// after 21 s. Under TCG on this machine QEMU itself freezes now and then (the console stops
// mid-line for good and no watchdog of the guest ever speaks): what a hardware watchdog does
// then, power-cycling the machine, is what the harness does, once per boot.
const frozenAfter = 5 * time.Minute

// quietMachine is the part of a *vm.Machine that watchFrozen uses.
type quietMachine interface {
	Quiet() time.Duration
	PowerCycle() error
	Stop()
}

// watchFrozen watches m until ctx ends: the first time its console is silent for after, it
// power-cycles m (the guest boots again on the same disks, as after a power cut); the second
// time it stops m, so the wait fails now rather than at its timeout. The function it returns
// says what it did, for a failure's message ("" when nothing).
func watchFrozen(ctx context.Context, m quietMachine, after time.Duration, logf func(string, ...any)) func() string {
	var mu sync.Mutex
	var did string
	say := func(format string, args ...any) {
		mu.Lock()
		did = fmt.Sprintf(format, args...)
		mu.Unlock()
	}
	go func() {
		tick := time.NewTicker(min(after/10, 10*time.Second))
		defer tick.Stop()
		cycled := false
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			q := m.Quiet()
			if q < after {
				continue
			}
			if q = q.Round(time.Second); cycled {
				say(" (QEMU was power-cycled once after %s of silence; its console was silent for %s again: stopped)", after, q)
				m.Stop()
				return
			}
			if err := m.PowerCycle(); err != nil {
				say(" (the console was silent for %s: %v)", q, err)
				return
			}
			logf("the console was silent for %s: QEMU froze (a running guest kernel reports a blocked task within 4 min); power-cycled it once", q)
			say(" (QEMU was power-cycled once after %s of silence)", q)
			cycled = true
		}
	}()
	return func() string {
		mu.Lock()
		defer mu.Unlock()
		return did
	}
}

// logDir is where consoles and server logs go: KILN_TEST_LOGS, which keeps them after the
// test, or the test's directory (removed with it).
func (e *env) logDir() string {
	e.t.Helper()
	d := os.Getenv("KILN_TEST_LOGS")
	if d == "" {
		return e.dir
	}
	if err := os.MkdirAll(d, 0o755); err != nil {
		e.t.Fatal(err)
	}
	return d
}

func tail(lines []string, n int) string {
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// dataFile reads a file from the data partition (ext4, mounted on /var in the guest) of a raw
// image with debugfs, as an operator inspecting a powered-off disk would.
func (e *env) dataFile(image, path string) (string, error) {
	e.t.Helper()
	part, err := extractData(image, e.t.TempDir())
	if err != nil {
		return "", err
	}
	out, err := exec.Command("debugfs", "-R", "cat "+path, part).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("debugfs cat %s: %v: %s", path, err, out)
	}
	// debugfs prints its banner on stderr; a missing file is reported there too.
	text := string(out)
	if i := strings.Index(text, "\n"); strings.HasPrefix(text, "debugfs ") && i >= 0 {
		text = text[i+1:]
	}
	if strings.Contains(text, "File not found by ext2_lookup") {
		return "", fmt.Errorf("%s: %w", path, os.ErrNotExist)
	}
	return text, nil
}

// extractData copies the data partition out of a raw image and replays its ext4 journal on the
// copy, as the kernel does when it next mounts it. The tests stop a guest by cutting its power
// while services still write to /var: what kiln-init synced is on the disk, but the bitmaps and
// inodes of later writes may be in the journal only, and debugfs does not read the journal.
func extractData(image, dir string) (string, error) {
	part, err := extractPartition(image, nodeimage.DataName, dir)
	if err != nil {
		return "", err
	}
	// e2fsck exits 1 when it replayed (changed) something, 0 when there was nothing to do.
	out, err := exec.Command("e2fsck", "-E", "journal_only", "-y", part).CombinedOutput()
	var exit *exec.ExitError
	if err != nil && !(errors.As(err, &exit) && exit.ExitCode() == 1) {
		return "", fmt.Errorf("replay the journal of %s's data partition: %v: %s", image, err, out)
	}
	return part, nil
}

// extractPartition copies the partition with GPT name name out of a raw image (sparse).
func extractPartition(image, name, dir string) (string, error) {
	d, err := diskfs.Open(image, diskfs.WithOpenMode(diskfs.ReadOnly))
	if err != nil {
		return "", err
	}
	defer d.Close()
	table, err := d.GetPartitionTable()
	if err != nil {
		return "", err
	}
	for _, p := range table.GetPartitions() {
		if p.Label() != name {
			continue
		}
		src, err := os.Open(image)
		if err != nil {
			return "", err
		}
		defer src.Close()
		dst := filepath.Join(dir, name+".img")
		f, err := os.Create(dst)
		if err != nil {
			return "", err
		}
		defer f.Close()
		if err := sparseCopy(f, io.NewSectionReader(src, p.GetStart(), p.GetSize())); err != nil {
			return "", err
		}
		return dst, nil
	}
	return "", fmt.Errorf("%s: no partition named %q", image, name)
}

func sparseCopy(dst *os.File, src io.Reader) error {
	buf := make([]byte, 1<<20)
	zero := make([]byte, len(buf))
	var off int64
	for {
		n, err := io.ReadFull(src, buf)
		if n > 0 {
			if !bytes.Equal(buf[:n], zero[:n]) {
				if _, werr := dst.WriteAt(buf[:n], off); werr != nil {
					return werr
				}
			}
			off += int64(n)
		}
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			return dst.Truncate(off)
		}
		if err != nil {
			return err
		}
	}
}

// copySparse copies a raw image keeping it sparse, so each boot starts from the baked bytes.
func copySparse(t *testing.T, src, dst string) {
	t.Helper()
	out, err := exec.Command("cp", "--sparse=always", src, dst).CombinedOutput()
	if err != nil {
		t.Fatalf("cp %s: %v: %s", src, err, out)
	}
}
