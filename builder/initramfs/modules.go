package initramfs

import (
	"bufio"
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/kilnproject/kiln/internal/decompress"
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

// normalizeAlias folds '-' to '_' outside bracket expressions, as kmod does
// with alias names and patterns ("crypto-crc32c" matches "crypto_crc32c").
func normalizeAlias(s string) string {
	var b strings.Builder
	inBracket := false
	for _, r := range s {
		switch {
		case r == '[':
			inBracket = true
		case r == ']':
			inBracket = false
		case r == '-' && !inBracket:
			r = '_'
		}
		b.WriteRune(r)
	}
	return b.String()
}

// kernelModules is one kernel's module directory inside a root tree, read the
// way modprobe reads it: modules.dep for files and hard dependencies,
// modules.softdep and each module's .modinfo for soft dependencies,
// modules.alias for aliases, modules.builtin and modules.builtin.modinfo for
// what the kernel has built in. Every file is opened through the root, which
// follows a symlink only while it stays inside the tree: nothing outside it is
// read, and a link that is absolute or climbs out is an error naming it.
type kernelModules struct {
	root *os.Root
	dir  string // the module directory, relative to root, without symlinks
	kver string

	path     map[string]string   // canonical name -> module file, relative to dir
	deps     map[string][]string // module file -> module files it needs (modules.dep order)
	builtin  map[string]bool     // canonical names of built-in modules
	aliases  []aliasEntry        // modules.alias, in file order
	bAliases []aliasEntry        // aliases of built-in modules (modules.builtin.modinfo)
	softdeps map[string]*softdep // canonical module name -> soft dependencies
	modinfo  map[string]*softdep // module file -> soft dependencies from its .modinfo
}

type aliasEntry struct {
	pattern string // normalized; may hold fnmatch wildcards
	module  string // canonical module name
	glob    bool
}

// softdep is what a "softdep" line or modinfo entry says: modules to load
// before (pre) and after (post) a module.
type softdep struct {
	pre, post []string
}

func (s *softdep) add(o softdep) {
	for _, n := range o.pre {
		if !slices.Contains(s.pre, n) {
			s.pre = append(s.pre, n)
		}
	}
	for _, n := range o.post {
		if !slices.Contains(s.post, n) {
			s.post = append(s.post, n)
		}
	}
}

// parseSoftdep parses "pre: a b post: c" (the tail of a softdep line, or a
// softdep= modinfo value). Names before any "pre:" or "post:" are ignored, as
// modprobe ignores them.
func parseSoftdep(fields []string) softdep {
	var s softdep
	var cur *[]string
	for _, f := range fields {
		switch f {
		case "pre:":
			cur = &s.pre
		case "post:":
			cur = &s.post
		default:
			if cur != nil {
				*cur = append(*cur, f)
			}
		}
	}
	return s
}

// modulesDir returns the module directory of kernel kver in the tree opened
// as r (usr/lib/modules/<kver>, or lib/modules/<kver>), relative to the
// tree's root. The directory and everything in it are read through r: a
// symlink is followed only while it stays inside the tree, and one that is
// absolute or climbs out of it is an error naming it.
func modulesDir(r *os.Root, kver string) (string, error) {
	if kver == "" || strings.ContainsRune(kver, '/') || kver == "." || kver == ".." {
		return "", fmt.Errorf("invalid kernel version %q", kver)
	}
	var tried []string
	for _, base := range []string{"usr/lib/modules", "lib/modules"} {
		dir := path.Join(base, kver)
		tried = append(tried, filepath.Join(r.Name(), dir))
		dep := path.Join(dir, "modules.dep")
		fi, err := r.Stat(dep)
		switch {
		case err == nil && fi.Mode().IsRegular():
			return dir, nil
		case err != nil && !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ENOTDIR):
			return "", inTreeError(r, dep, err)
		}
	}
	var have []string
	entries, _ := fs.ReadDir(r.FS(), "usr/lib/modules")
	for _, e := range entries {
		if fi, err := r.Stat(path.Join("usr/lib/modules", e.Name(), "modules.dep")); err == nil && fi.Mode().IsRegular() {
			have = append(have, e.Name())
		}
	}
	return "", fmt.Errorf("no modules for kernel %s in root tree %s (looked for modules.dep in %s; kernels present: %s)",
		kver, r.Name(), strings.Join(tried, " and "), orNone(have))
}

// inTreeError describes err, the failure of opening rel (relative to the
// tree's root) through r: it names the file by its host path and, when rel is
// itself a symlink, its target.
func inTreeError(r *os.Root, rel string, err error) error {
	name := filepath.Join(r.Name(), filepath.FromSlash(rel))
	if fi, lerr := r.Lstat(rel); lerr == nil && fi.Mode()&fs.ModeSymlink != 0 {
		if target, rerr := r.Readlink(rel); rerr == nil {
			name += fmt.Sprintf(" (a symlink to %q)", target)
		}
	}
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("open %s: %w", name, err)
	}
	return fmt.Errorf("open %s: %w (the initramfs takes files only from inside the root tree: "+
		"absolute symlinks and symlinks leading out of it are refused)", name, err)
}

// openKernelModules reads kver's module tables from the tree opened as r.
func openKernelModules(r *os.Root, kver string) (*kernelModules, error) {
	dir, err := modulesDir(r, kver)
	if err != nil {
		return nil, err
	}
	k := &kernelModules{root: r, dir: dir, kver: kver, path: map[string]string{}, deps: map[string][]string{},
		builtin: map[string]bool{}, softdeps: map[string]*softdep{}, modinfo: map[string]*softdep{}}
	if err := k.readDep(); err != nil {
		return nil, err
	}
	for _, f := range []func() error{k.readBuiltin, k.readBuiltinModinfo, k.readSoftdep, k.readAlias} {
		if err := f(); err != nil {
			return nil, err
		}
	}
	return k, nil
}

// maxFileSize bounds every file the initramfs takes from the root tree (a
// module, compressed or not, and each module table): the largest module of a
// distribution kernel is a few tens of MiB, modules.alias about 1 MiB.
const maxFileSize = 256 << 20

// name is how errors name a file of the module directory: its host path.
func (k *kernelModules) name(rel string) string {
	return filepath.Join(k.root.Name(), filepath.FromSlash(k.dir), filepath.FromSlash(rel))
}

// open opens the regular file rel (relative to the module directory) through
// the root: symlinks are followed only inside the tree. A missing file is an
// error wrapping fs.ErrNotExist.
func (k *kernelModules) open(rel string) (*os.File, error) {
	p := path.Join(k.dir, rel)
	// Stat first: opening a named pipe would wait for a writer.
	fi, err := k.root.Stat(p)
	if err != nil {
		return nil, inTreeError(k.root, p, err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("open %s: not a regular file (%s)", k.name(rel), fi.Mode().Type())
	}
	if fi.Size() > maxFileSize {
		return nil, fmt.Errorf("open %s: %d bytes, more than the %d the initramfs takes from one file", k.name(rel), fi.Size(), maxFileSize)
	}
	f, err := k.root.Open(p)
	if err != nil {
		return nil, inTreeError(k.root, p, err)
	}
	return f, nil
}

// readAll reads r to its end, failing once it has given more than
// maxFileSize bytes.
func readAll(r io.Reader) ([]byte, error) {
	data, err := io.ReadAll(io.LimitReader(r, maxFileSize+1))
	if err == nil && len(data) > maxFileSize {
		err = fmt.Errorf("more than %d bytes", maxFileSize)
	}
	return data, err
}

// readFile reads rel (relative to the module directory) from the tree.
func (k *kernelModules) readFile(rel string) ([]byte, error) {
	f, err := k.open(rel)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := readAll(f)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", k.name(rel), err)
	}
	return data, nil
}

// eachLine calls fn for every non-blank, non-comment line of rel. A missing
// file is no lines when optional.
func (k *kernelModules) eachLine(rel string, optional bool, fn func(n int, line string) error) error {
	f, err := k.open(rel)
	if optional && errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if err := fn(n, line); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("read %s: %w", k.name(rel), err)
	}
	return nil
}

// checkModulePath rejects a module path that would leave the module
// directory: absolute, with "..", or otherwise not a clean relative path.
func checkModulePath(p string) error {
	if !fs.ValidPath(p) || p == "." {
		return fmt.Errorf("module path %q is not a plain path inside the module directory", p)
	}
	return nil
}

func (k *kernelModules) readDep() error {
	return k.eachLine("modules.dep", false, func(n int, line string) error {
		mod, rest, ok := strings.Cut(line, ":")
		mod = strings.TrimSpace(mod)
		if !ok || mod == "" {
			return fmt.Errorf("%s:%d: malformed line %q (want \"path.ko: deps...\")", k.name("modules.dep"), n, line)
		}
		deps := strings.Fields(rest)
		for _, p := range append([]string{mod}, deps...) {
			if err := checkModulePath(p); err != nil {
				return fmt.Errorf("%s:%d: %w", k.name("modules.dep"), n, err)
			}
		}
		k.path[moduleName(mod)] = mod
		k.deps[mod] = deps
		return nil
	})
}

// readBuiltin reads modules.builtin; a missing one means nothing is built in.
func (k *kernelModules) readBuiltin() error {
	return k.eachLine("modules.builtin", true, func(_ int, line string) error {
		k.builtin[moduleName(line)] = true
		return nil
	})
}

// readBuiltinModinfo reads the aliases and soft dependencies of built-in
// modules from modules.builtin.modinfo ("module.key=value" strings, each
// ending in NUL). A missing file means none.
func (k *kernelModules) readBuiltinModinfo() error {
	data, err := k.readFile("modules.builtin.modinfo")
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, rec := range bytes.Split(data, []byte{0}) {
		kv, val, ok := strings.Cut(string(rec), "=")
		mod, key, ok2 := strings.Cut(kv, ".")
		if !ok || !ok2 {
			continue
		}
		mod = canonical(mod)
		if key == "alias" {
			k.bAliases = append(k.bAliases, newAlias(val, mod))
		}
	}
	return nil
}

func newAlias(pattern, module string) aliasEntry {
	p := normalizeAlias(pattern)
	return aliasEntry{pattern: p, module: canonical(module), glob: strings.ContainsAny(p, "*?[")}
}

// readSoftdep reads modules.softdep ("softdep MODULE pre: ... post: ...").
// One module may have several lines; their names add up.
func (k *kernelModules) readSoftdep() error {
	return k.eachLine("modules.softdep", true, func(n int, line string) error {
		f := strings.Fields(line)
		if f[0] != "softdep" {
			return nil
		}
		if len(f) < 2 {
			return fmt.Errorf("%s:%d: softdep without a module name", k.name("modules.softdep"), n)
		}
		mod := canonical(f[1])
		if k.softdeps[mod] == nil {
			k.softdeps[mod] = &softdep{}
		}
		k.softdeps[mod].add(parseSoftdep(f[2:]))
		return nil
	})
}

// readAlias reads modules.alias ("alias PATTERN MODULE"); a missing file
// means no aliases.
func (k *kernelModules) readAlias() error {
	return k.eachLine("modules.alias", true, func(n int, line string) error {
		f := strings.Fields(line)
		if f[0] != "alias" {
			return nil
		}
		if len(f) != 3 {
			return fmt.Errorf("%s:%d: malformed line %q (want \"alias PATTERN MODULE\")", k.name("modules.alias"), n, line)
		}
		k.aliases = append(k.aliases, newAlias(f[1], f[2]))
		return nil
	})
}

// target is what a name resolves to: a module file, or a built-in module
// (nothing to load).
type target struct {
	file    string // relative to the module directory; "" when built in
	builtin string // canonical name of the built-in module
}

// lookup resolves a module name or alias as modprobe does: a module of that
// name, else every module whose modules.alias pattern matches it (in file
// order), else a built-in module of that name or alias. It returns nothing
// when nothing matches.
func (k *kernelModules) lookup(name string) []target {
	c := canonical(name)
	if f, ok := k.path[c]; ok {
		return []target{{file: f}}
	}
	n := normalizeAlias(name)
	var out []target
	seen := map[string]bool{}
	for _, a := range k.aliases {
		if !a.matches(n) || seen[a.module] {
			continue
		}
		seen[a.module] = true
		switch f, ok := k.path[a.module]; {
		case ok:
			out = append(out, target{file: f})
		case k.builtin[a.module]:
			out = append(out, target{builtin: a.module})
		}
	}
	if len(out) > 0 {
		return out
	}
	if k.builtin[c] {
		return []target{{builtin: c}}
	}
	for _, a := range k.bAliases {
		if a.matches(n) {
			return []target{{builtin: a.module}}
		}
	}
	return nil
}

func (a aliasEntry) matches(name string) bool {
	if !a.glob {
		return a.pattern == name
	}
	ok, err := path.Match(a.pattern, name)
	return err == nil && ok
}

// softdepsOf returns the soft dependencies of module file mod: its
// modules.softdep lines and the softdep entries of its .modinfo.
func (k *kernelModules) softdepsOf(mod string) (softdep, error) {
	var s softdep
	if d := k.softdeps[moduleName(mod)]; d != nil {
		s.add(*d)
	}
	mi, ok := k.modinfo[mod]
	if !ok {
		info, err := k.readModinfo(mod)
		if err != nil {
			return s, err
		}
		mi = &softdep{}
		for _, v := range info["softdep"] {
			mi.add(parseSoftdep(strings.Fields(v)))
		}
		k.modinfo[mod] = mi
	}
	s.add(*mi)
	return s, nil
}

// readModule returns the contents of module file mod as the kernel gets them
// (decompressed when the file is .ko.xz, .ko.zst or .ko.gz).
func (k *kernelModules) readModule(mod string) ([]byte, error) {
	data, err := k.readFile(mod)
	if err != nil {
		return nil, fmt.Errorf("read kernel module: %w", err)
	}
	kind, base := decompress.ByExtension(mod)
	if !strings.HasSuffix(base, ".ko") || kind == decompress.Bzip2 {
		return nil, fmt.Errorf("kernel module %s: not a .ko, .ko.xz, .ko.zst or .ko.gz file", k.name(mod))
	}
	if kind == decompress.None {
		return data, nil
	}
	dec, err := decompress.Open(bytes.NewReader(data), kind)
	if err != nil {
		return nil, fmt.Errorf("kernel module %s: %s: %w", k.name(mod), kind, err)
	}
	defer dec.Close()
	out, err := readAll(dec)
	if err != nil {
		return nil, fmt.Errorf("kernel module %s: decompress: %w", k.name(mod), err)
	}
	return out, nil
}

// readModinfo returns the .modinfo entries (key -> values) of module file mod.
func (k *kernelModules) readModinfo(mod string) (map[string][]string, error) {
	data, err := k.readModule(mod)
	if err != nil {
		return nil, err
	}
	info, err := parseModinfo(data)
	if err != nil {
		return nil, fmt.Errorf("kernel module %s: %w", k.name(mod), err)
	}
	return info, nil
}

// parseModinfo reads the .modinfo section of an ELF kernel module: NUL-ended
// "key=value" strings. A module without the section has no entries.
func parseModinfo(module []byte) (map[string][]string, error) {
	f, err := elf.NewFile(bytes.NewReader(module))
	if err != nil {
		return nil, fmt.Errorf("not an ELF module: %w", err)
	}
	defer f.Close()
	info := map[string][]string{}
	sec := f.Section(".modinfo")
	if sec == nil {
		return info, nil
	}
	data, err := sec.Data()
	if err != nil {
		return nil, fmt.Errorf("read .modinfo: %w", err)
	}
	for _, rec := range bytes.Split(data, []byte{0}) {
		if key, val, ok := strings.Cut(string(rec), "="); ok {
			info[key] = append(info[key], val)
		}
	}
	return info, nil
}

// resolve returns the module files (relative to the module directory) that
// loading the named modules needs, in the order modprobe loads them, each
// file once. For every module: its hard dependencies (modules.dep, last
// listed first, each with its own soft dependencies), then its softdep "pre"
// modules, the module itself, then its "post" modules. Soft dependency names
// are looked up like requested names (module, alias, built-in); one that
// matches nothing is skipped, as modprobe skips it. A requested name that
// matches nothing is an error naming it and the kernel.
func (k *kernelModules) resolve(names []string) ([]string, error) {
	r := resolver{k: k, state: map[string]int{}}
	var unknown []string
	for _, n := range names {
		if strings.TrimSpace(n) == "" {
			return nil, fmt.Errorf("empty module name in list %q", names)
		}
		ts := k.lookup(strings.TrimSpace(n))
		if len(ts) == 0 {
			unknown = append(unknown, n)
			continue
		}
		for _, t := range ts {
			if t.file == "" {
				continue
			}
			if err := r.visit(t.file, nil, false); err != nil {
				return nil, err
			}
		}
	}
	if len(unknown) > 0 {
		return nil, fmt.Errorf("kernel %s has no module or alias named %s (not in %s, %s nor built in)",
			k.kver, strings.Join(unknown, ", "), k.name("modules.dep"), k.name("modules.alias"))
	}
	return r.order, nil
}

type resolver struct {
	k     *kernelModules
	order []string
	state map[string]int // module file -> 0 unseen, 1 visiting, 2 loaded
}

// visit appends mod, and what it needs first, to the load order. soft says
// that mod is reached through a soft dependency: one that loops back to a
// module being visited is dropped, whereas a loop of hard dependencies is an
// error.
func (r *resolver) visit(mod string, chain []string, soft bool) error {
	k := r.k
	switch r.state[mod] {
	case 2:
		return nil
	case 1:
		if soft {
			return nil
		}
		return fmt.Errorf("module dependency cycle in %s: %s -> %s", k.name("modules.dep"), strings.Join(chain, " -> "), mod)
	}
	deps, ok := k.deps[mod]
	if !ok {
		user := "a requested module"
		if len(chain) > 0 {
			user = chain[len(chain)-1]
		}
		return fmt.Errorf("kernel %s: %s lists %s as a dependency of %s but has no entry for it", k.kver, k.name("modules.dep"), mod, user)
	}
	r.state[mod] = 1
	chain = append(slices.Clone(chain), mod)
	for i := len(deps) - 1; i >= 0; i-- {
		if err := r.visit(deps[i], chain, false); err != nil {
			return err
		}
	}
	sd, err := k.softdepsOf(mod)
	if err != nil {
		return err
	}
	if err := r.visitSoft(sd.pre, chain); err != nil {
		return err
	}
	r.state[mod] = 2
	r.order = append(r.order, mod)
	return r.visitSoft(sd.post, chain)
}

func (r *resolver) visitSoft(names, chain []string) error {
	for _, n := range names {
		for _, t := range r.k.lookup(n) {
			if t.file == "" {
				continue
			}
			if err := r.visit(t.file, chain, true); err != nil {
				return err
			}
		}
	}
	return nil
}

// resolveModules returns the module files (paths relative to the kernel's module
// directory, for example "kernel/fs/squashfs/squashfs.ko") that loading the
// named modules needs, in load order, every file once.
//
// root is the assembled root tree and kver the kernel version; the module
// tables are read from its usr/lib/modules/<kver> (or lib/modules/<kver>),
// resolved inside the tree. Names are module names or aliases (modules.alias,
// e.g. crc32c), '-' and '_' equivalent. Hard dependencies come from
// modules.dep, soft ones from modules.softdep and each module's .modinfo:
// "pre" modules load before a module, "post" modules after it. A built-in
// module (modules.builtin, modules.builtin.modinfo) needs no file. An
// unknown name is an error naming it and the kernel version; a module path in
// modules.dep that leaves the module directory, and a file reached through an
// absolute symlink or one leading out of the tree, are errors naming them.
func resolveModules(root, kver string, names []string) ([]string, error) {
	r, err := os.OpenRoot(root)
	if err != nil {
		return nil, fmt.Errorf("open root tree: %w", err)
	}
	defer r.Close()
	k, err := openKernelModules(r, kver)
	if err != nil {
		return nil, err
	}
	return k.resolve(names)
}
