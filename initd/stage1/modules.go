package stage1

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kilnproject/kiln/internal/decompress"
)

var moduleSuffixes = []string{".ko", ".ko.xz", ".ko.zst", ".ko.gz"}

// parseModulesLoad reads a modules.load list: one absolute module path per line, blank lines and
// lines starting with # ignored. name is used in errors (file:line).
func parseModulesLoad(r io.Reader, name string) ([]string, error) {
	var mods []string
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if !filepath.IsAbs(line) {
			return nil, fmt.Errorf("%s:%d: module path %q is not absolute", name, n, line)
		}
		if !hasModuleSuffix(line) {
			return nil, fmt.Errorf("%s:%d: module path %q does not end in %s", name, n, line, strings.Join(moduleSuffixes, ", "))
		}
		mods = append(mods, filepath.Clean(line))
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %w", name, err)
	}
	return mods, nil
}

func hasModuleSuffix(p string) bool {
	for _, s := range moduleSuffixes {
		if strings.HasSuffix(p, s) {
			return true
		}
	}
	return false
}

// moduleError records a module that failed to load.
type moduleError struct {
	path string
	err  error
	// kernel holds what the kernel logged about the module while loading it (e.g. "erofs:
	// Unknown symbol crc32c (err -2)").
	kernel []string
}

func (e moduleError) Error() string {
	msg := fmt.Sprintf("load module %s: %v", e.path, e.err)
	if len(e.kernel) > 0 {
		msg += " (kernel: " + strings.Join(e.kernel, "; ") + ")"
	}
	return msg
}

// moduleReport is what loading a module list did.
type moduleReport struct {
	loaded  int           // loaded now or already loaded
	unused  []string      // modules whose init found no device or CPU feature to use (ENODEV)
	failed  []moduleError // in list order
	elapsed time.Duration
}

// loadModules loads each module in the order given: modules.load lists every module after
// those it needs. A module that is already loaded counts as loaded. A module whose init finds
// nothing to drive on this machine (ENODEV, e.g. crc32c-intel on a CPU without SSE4.2 while
// crc32c_generic provides the algorithm) is reported as unused, not as a failure. It goes on
// past failures (a missing driver shows up later as a missing disk) and reports them with what
// the kernel logged about them.
func loadModules(ctx context.Context, log *slog.Logger, paths []string) moduleReport {
	return loadModulesWith(ctx, log, paths, loadModule, readKernelLog)
}

// loadModulesWith is loadModules with the module loader and the kernel log reader passed in,
// so that tests can fake them.
func loadModulesWith(ctx context.Context, log *slog.Logger, paths []string, load func(string) (bool, error), klog func() []byte) moduleReport {
	var rep moduleReport
	start := time.Now()
	for _, p := range paths {
		if ctx.Err() != nil {
			rep.failed = append(rep.failed, moduleError{path: p, err: ctx.Err()})
			continue
		}
		loaded, err := load(p)
		switch {
		case errors.Is(err, unix.ENODEV):
			log.Info("module not used: no device or CPU feature for it on this machine", "module", p)
			rep.unused = append(rep.unused, p)
		case err != nil:
			me := moduleError{path: p, err: err, kernel: kernelLines(klog(), moduleName(p), 3)}
			args := []any{"module", p, "err", me.err}
			if len(me.kernel) > 0 {
				args = append(args, "kernel", strings.Join(me.kernel, "; "))
			}
			log.Warn("module not loaded", args...)
			rep.failed = append(rep.failed, me)
		case loaded:
			rep.loaded++
			log.Debug("module loaded", "module", p)
		default:
			rep.loaded++
			log.Debug("module already loaded", "module", p)
		}
	}
	rep.elapsed = time.Since(start)
	return rep
}

// moduleName is the kernel's name of a module file: its base name without the .ko suffix,
// '-' as '_' ("/lib/modules/6.1.0/kernel/arch/x86/crypto/crc32c-intel.ko" is crc32c_intel).
func moduleName(p string) string {
	base := filepath.Base(p)
	if i := strings.Index(base, ".ko"); i >= 0 {
		base = base[:i]
	}
	return strings.ReplaceAll(base, "-", "_")
}

// readKernelLog returns the kernel's log buffer (what dmesg prints), or nothing when it cannot
// be read.
func readKernelLog() []byte {
	n, err := unix.Klogctl(unix.SYSLOG_ACTION_SIZE_BUFFER, nil)
	if err != nil || n <= 0 {
		return nil
	}
	buf := make([]byte, n)
	n, err = unix.Klogctl(unix.SYSLOG_ACTION_READ_ALL, buf)
	if err != nil || n < 0 {
		return nil
	}
	return buf[:n]
}

// kernelLines returns the last max messages of the kernel log that the kernel wrote about
// module ("<4>[    1.234567] erofs: Unknown symbol crc32c (err -2)" -> "erofs: Unknown symbol
// crc32c (err -2)").
func kernelLines(klog []byte, module string, max int) []string {
	var out []string
	for _, line := range strings.Split(string(klog), "\n") {
		msg := strings.TrimSpace(line)
		if strings.HasPrefix(msg, "<") {
			if i := strings.IndexByte(msg, '>'); i > 0 {
				msg = strings.TrimSpace(msg[i+1:])
			}
		}
		if strings.HasPrefix(msg, "[") {
			if i := strings.IndexByte(msg, ']'); i > 0 {
				msg = strings.TrimSpace(msg[i+1:])
			}
		}
		if strings.HasPrefix(msg, module+": ") {
			out = append(out, msg)
		}
	}
	if len(out) > max {
		out = out[len(out)-max:]
	}
	return out
}

// loadModule loads one kernel module file (.ko with finit_module; .ko.xz, .ko.zst, .ko.gz are
// decompressed in memory and passed to init_module). It reports false, nil when the module was
// already loaded. ENODEV (the module found nothing to drive) is returned as it is.
func loadModule(path string) (loaded bool, err error) {
	f, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	if strings.HasSuffix(path, ".ko") {
		err = unix.FinitModule(int(f.Fd()), "", 0)
		if errors.Is(err, unix.ENOSYS) {
			var img []byte
			if img, err = io.ReadAll(f); err == nil {
				err = unix.InitModule(img, "")
			}
		}
	} else {
		var img []byte
		if img, err = decompressModule(path, f); err != nil {
			return false, err
		}
		err = unix.InitModule(img, "")
	}
	switch {
	case errors.Is(err, unix.EEXIST):
		return false, nil
	case errors.Is(err, unix.ENOENT):
		return false, fmt.Errorf("%w: a symbol or facility it needs is missing; a module it needs (a dependency or softdep) was not loaded before it", err)
	case errors.Is(err, unix.ENOEXEC), errors.Is(err, unix.EINVAL):
		return false, fmt.Errorf("%w: not a module for this kernel", err)
	case err != nil:
		return false, err
	}
	return true, nil
}

func decompressModule(path string, r io.Reader) ([]byte, error) {
	kind, _ := decompress.ByExtension(path)
	if kind == decompress.None || kind == decompress.Bzip2 {
		return nil, fmt.Errorf("unknown module compression")
	}
	dec, err := decompress.Open(r, kind)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", kind, err)
	}
	defer dec.Close()
	var buf bytes.Buffer
	if _, err := io.Copy(&buf, dec); err != nil {
		return nil, fmt.Errorf("decompress: %w", err)
	}
	return buf.Bytes(), nil
}
