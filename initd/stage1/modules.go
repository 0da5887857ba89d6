package stage1

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/klauspost/compress/zstd"
	"github.com/ulikunitz/xz"
	"golang.org/x/sys/unix"
)

// ModulesLoadPath is the list of kernel modules stage 1 loads, in order.
const ModulesLoadPath = "/etc/kiln/modules.load"

var moduleSuffixes = []string{".ko", ".ko.xz", ".ko.zst", ".ko.gz"}

// ParseModulesLoad reads a modules.load list: one absolute module path per line, blank lines and
// lines starting with # ignored. name is used in errors (file:line).
func ParseModulesLoad(r io.Reader, name string) ([]string, error) {
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

// ModuleError records a module that failed to load.
type ModuleError struct {
	Path string
	Err  error
}

func (e ModuleError) Error() string { return fmt.Sprintf("load module %s: %v", e.Path, e.Err) }

// LoadModules loads each module in order. A module that is already loaded counts as loaded. It goes
// on past failures (a missing driver shows up later as a missing disk) and returns them.
func LoadModules(ctx context.Context, log *slog.Logger, paths []string) []ModuleError {
	var failed []ModuleError
	for _, p := range paths {
		if ctx.Err() != nil {
			failed = append(failed, ModuleError{Path: p, Err: ctx.Err()})
			continue
		}
		loaded, err := LoadModule(p)
		switch {
		case err != nil:
			log.Warn("module not loaded", "module", p, "err", err)
			failed = append(failed, ModuleError{Path: p, Err: err})
		case loaded:
			log.Debug("module loaded", "module", p)
		default:
			log.Debug("module already loaded", "module", p)
		}
	}
	return failed
}

// LoadModule loads one kernel module file (.ko with finit_module; .ko.xz, .ko.zst, .ko.gz are
// decompressed in memory and passed to init_module). It reports false, nil when the module was
// already loaded.
func LoadModule(path string) (loaded bool, err error) {
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
		return false, fmt.Errorf("%w: unknown symbol, a module it needs is missing or listed after it (see dmesg)", err)
	case errors.Is(err, unix.ENOEXEC), errors.Is(err, unix.EINVAL):
		return false, fmt.Errorf("%w: not a module for this kernel (see dmesg)", err)
	case err != nil:
		return false, err
	}
	return true, nil
}

func decompressModule(path string, r io.Reader) ([]byte, error) {
	var dec io.Reader
	switch {
	case strings.HasSuffix(path, ".xz"):
		xr, err := xz.NewReader(r)
		if err != nil {
			return nil, fmt.Errorf("xz: %w", err)
		}
		dec = xr
	case strings.HasSuffix(path, ".zst"):
		zr, err := zstd.NewReader(r)
		if err != nil {
			return nil, fmt.Errorf("zstd: %w", err)
		}
		defer zr.Close()
		dec = zr
	case strings.HasSuffix(path, ".gz"):
		gr, err := gzip.NewReader(r)
		if err != nil {
			return nil, fmt.Errorf("gzip: %w", err)
		}
		dec = gr
	default:
		return nil, fmt.Errorf("unknown module compression")
	}
	var buf bytes.Buffer
	if _, err := io.Copy(&buf, dec); err != nil {
		return nil, fmt.Errorf("decompress: %w", err)
	}
	return buf.Bytes(), nil
}
