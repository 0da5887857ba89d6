package initramfs

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// moduleName returns the canonical name of a module file path such as
// "kernel/arch/x86/crypto/crc32c-intel.ko.xz": the base name without its
// .ko[.xz|.zst|.gz] suffix, with '-' folded to '_' (as kmod does).
func moduleName(p string) string {
	base := path.Base(p)
	if i := strings.Index(base, ".ko"); i >= 0 {
		base = base[:i]
	}
	return canonical(base)
}

func canonical(name string) string {
	return strings.ReplaceAll(name, "-", "_")
}

// depTable is the parsed modules.dep of one kernel.
type depTable struct {
	path map[string]string   // canonical name -> relative .ko path
	deps map[string][]string // relative .ko path -> relative .ko paths it needs
}

func readDepTable(modulesDir string) (*depTable, error) {
	name := filepath.Join(modulesDir, "modules.dep")
	f, err := os.Open(name)
	if err != nil {
		return nil, fmt.Errorf("read module dependencies: %w", err)
	}
	defer f.Close()
	t := &depTable{path: map[string]string{}, deps: map[string][]string{}}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	for line := 1; sc.Scan(); line++ {
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		mod, rest, ok := strings.Cut(text, ":")
		if !ok || mod == "" {
			return nil, fmt.Errorf("%s:%d: malformed line %q (want \"path.ko: deps...\")", name, line, text)
		}
		mod = strings.TrimSpace(mod)
		t.path[moduleName(mod)] = mod
		t.deps[mod] = strings.Fields(rest)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %w", name, err)
	}
	return t, nil
}

// readBuiltin returns the canonical names of the modules built into the
// kernel. A missing modules.builtin means none are.
func readBuiltin(modulesDir string) (map[string]bool, error) {
	name := filepath.Join(modulesDir, "modules.builtin")
	data, err := os.ReadFile(name)
	if errors.Is(err, fs.ErrNotExist) {
		return map[string]bool{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read built-in module list: %w", err)
	}
	builtin := map[string]bool{}
	for _, line := range strings.Split(string(data), "\n") {
		if line = strings.TrimSpace(line); line != "" {
			builtin[moduleName(line)] = true
		}
	}
	return builtin, nil
}

// Resolve returns the module files (paths relative to modulesDir, for
// example "kernel/fs/squashfs/squashfs.ko") that loading the named modules
// needs, each dependency before the modules that use it and every file once.
//
// modulesDir is a kernel's module directory, .../lib/modules/<kver>; its
// modules.dep is the source of truth. Names match with '-' and '_'
// equivalent. A module built into the kernel (listed in modules.builtin) is
// skipped. An unknown name is an error naming it and the kernel version.
// Soft dependencies (modules.softdep) are not followed: name them explicitly
// (e.g. crc32c_generic).
func Resolve(modulesDir string, names []string) ([]string, error) {
	kver := filepath.Base(modulesDir)
	table, err := readDepTable(modulesDir)
	if err != nil {
		return nil, err
	}
	builtin, err := readBuiltin(modulesDir)
	if err != nil {
		return nil, err
	}

	var (
		order []string
		state = map[string]int{} // 0 unseen, 1 visiting, 2 done
	)
	var visit func(mod string, chain []string) error
	visit = func(mod string, chain []string) error {
		switch state[mod] {
		case 2:
			return nil
		case 1:
			return fmt.Errorf("module dependency cycle in %s/modules.dep: %s -> %s", kver, strings.Join(chain, " -> "), mod)
		}
		deps, ok := table.deps[mod]
		if !ok {
			user := "a requested module"
			if len(chain) > 0 {
				user = chain[len(chain)-1]
			}
			return fmt.Errorf("kernel %s: modules.dep lists %s as a dependency of %s but has no entry for it", kver, mod, user)
		}
		state[mod] = 1
		for _, d := range deps {
			if err := visit(d, append(chain, mod)); err != nil {
				return err
			}
		}
		state[mod] = 2
		order = append(order, mod)
		return nil
	}

	var unknown []string
	for _, n := range names {
		c := canonical(strings.TrimSpace(n))
		if c == "" {
			return nil, fmt.Errorf("empty module name in list %q", names)
		}
		if mod, ok := table.path[c]; ok {
			if err := visit(mod, nil); err != nil {
				return nil, err
			}
			continue
		}
		if builtin[c] {
			continue
		}
		unknown = append(unknown, n)
	}
	if len(unknown) > 0 {
		return nil, fmt.Errorf("kernel %s has no module named %s (neither in %s nor built in)",
			kver, strings.Join(unknown, ", "), filepath.Join(modulesDir, "modules.dep"))
	}
	return order, nil
}
