// Package initramfs builds kiln's initramfs: a newc cpio archive holding
// the static kiln-init binary as /init, the few kernel modules stage 1 needs
// to reach the root filesystem (with /etc/kiln/modules.load giving their load
// order), the directories stage 1 mounts on and the /dev/console and /dev/null
// device nodes.
//
// The archive is deterministic: entries are sorted, owned by root, have mtime
// 0 and sequential inode numbers, so two builds from the same inputs give the
// same bytes. It is zstd-compressed by default (the Debian cloud kernel has
// CONFIG_RD_ZSTD=y, and zstd decompresses several times faster than gzip).
package initramfs

import (
	"bytes"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
	"github.com/u-root/u-root/pkg/cpio"

	"github.com/kilnproject/kiln/internal/atomicfile"
	"github.com/kilnproject/kiln/internal/decompress"
	"github.com/kilnproject/kiln/internal/lastuse"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

// Compression codecs understood by Write.
const (
	Zstd = "zstd" // the default
	Gzip = "gzip"
	None = "none"
)

// Spec says what goes into the initramfs.
type Spec struct {
	// Root is the assembled root tree; its kernel modules are read from
	// usr/lib/modules/<KernelVersion> (or lib/modules/<KernelVersion>),
	// every path resolved inside the tree.
	Root string
	// KernelVersion names the module directory, e.g. "6.1.0-57-cloud-amd64".
	KernelVersion string
	// Modules are module names or aliases (e.g. virtio_blk, squashfs,
	// crc32c); hard dependencies (modules.dep) and soft ones (softdep pre
	// and post) are added in modprobe's load order, built-in modules are
	// skipped (see resolveModules).
	Modules []string
	// Init is the host path of the static init binary (kiln-stage1), written as /init.
	Init string
	// Compression is Zstd (when empty), Gzip or None.
	Compression string
	// CacheDir, when set, keeps each compressed archive as <sha256 of its uncompressed cpio
	// stream>.<compression>: an archive of the same records is copied from there instead of
	// compressed again (the slow part of Write). An entry is used only after it decompresses
	// to the stream its name says.
	CacheDir string
	// Shared, with CacheDir, is a store of archives that several machines share (kiln bake
	// --cache-repo), keyed like CacheDir's files: an archive CacheDir lacks is taken from it
	// (and checked the same way), and one compressed here is added to it.
	Shared Shared
}

// Shared is a store of cache entries that several machines share. Get streams entry key to
// read and reports whether the store held it whole and verified (when it returns false, what
// read took must be discarded); Put adds the stream write makes under key. Both report their
// own failures.
type Shared interface {
	Get(key string, read func(io.Reader) error) bool
	Put(key string, write func(io.Writer) error)
}

// entry is one record of the archive.
type entry struct {
	Name  string // absolute path inside the initramfs, e.g. "/init"
	Mode  uint64 // cpio mode: file type bits and permissions
	Size  int64  // content size (0 for directories and devices)
	Major uint64 // device major number (character devices)
	Minor uint64 // device minor number (character devices)
}

// IsDir reports whether e is a directory.
func (e entry) IsDir() bool { return e.Mode&cpio.S_IFMT == cpio.S_IFDIR }

// isCharDev reports whether e is a character device.
func (e entry) isCharDev() bool { return e.Mode&cpio.S_IFMT == cpio.S_IFCHR }

// Manifest describes a written initramfs.
type Manifest struct {
	KernelVersion string
	Compression   string
	// Modules are the module files in load order, as absolute paths inside
	// the initramfs (the lines of /etc/kiln/modules.load).
	Modules []string
	// Entries are the archive records in the order written.
	Entries []entry
}

// dirs are the directories stage 1 needs besides the module tree.
var baseDirs = []string{"dev", "etc", "etc/kiln", "proc", "run", "sys", "sysroot", "tmp"}

func orNone(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}

// Write writes the initramfs described by s to w and returns its manifest.
func Write(w io.Writer, s Spec) (*Manifest, error) {
	comp := s.Compression
	if comp == "" {
		comp = Zstd
	}
	if comp != Zstd && comp != Gzip && comp != None {
		return nil, fmt.Errorf("initramfs compression %q: want %s, %s or %s", s.Compression, Zstd, Gzip, None)
	}
	if s.Init == "" {
		return nil, errors.New("initramfs: no init binary given")
	}
	initData, err := readStaticInit(s.Init)
	if err != nil {
		return nil, err
	}
	root, err := os.OpenRoot(s.Root)
	if err != nil {
		return nil, fmt.Errorf("open root tree: %w", err)
	}
	defer root.Close()
	kmods, err := openKernelModules(root, s.KernelVersion)
	if err != nil {
		return nil, err
	}
	mods, err := kmods.resolve(s.Modules)
	if err != nil {
		return nil, err
	}
	files := records{}
	files.addFile("init", initData, 0o755)
	load, err := files.addModules(kmods, mods, s.KernelVersion)
	if err != nil {
		return nil, err
	}
	files.addDevicesAndDirs()
	man := &Manifest{KernelVersion: s.KernelVersion, Compression: comp, Modules: load}
	if s.CacheDir == "" || comp == None {
		if err := files.write(w, comp, man); err != nil {
			return nil, err
		}
		return man, nil
	}
	if err := files.writeCached(w, comp, man, s.CacheDir, s.Shared); err != nil {
		return nil, err
	}
	return man, nil
}

// writeCached writes the archive compressed with comp to w, from dir when dir holds it (see
// Spec.CacheDir), else compressed now and kept in dir.
func (f records) writeCached(w io.Writer, comp string, man *Manifest, dir string, shared Shared) error {
	h := sha256.New()
	if err := f.write(h, None, man); err != nil {
		return err
	}
	sum := hex.EncodeToString(h.Sum(nil))
	name := sum + "." + comp
	entry := filepath.Join(dir, name)
	if data, err := os.ReadFile(entry); err == nil && holdsStream(data, sum) {
		lastuse.Mark(entry)
		if _, err := w.Write(data); err != nil {
			return fmt.Errorf("write initramfs: %w", err)
		}
		return nil
	}
	var buf bytes.Buffer
	pulled := shared != nil && shared.Get(name, func(r io.Reader) error {
		if _, err := buf.ReadFrom(r); err != nil {
			return err
		}
		if !holdsStream(buf.Bytes(), sum) {
			return fmt.Errorf("the archive does not decompress to the cpio stream of sha256 %s", sum)
		}
		return nil
	})
	if !pulled {
		buf.Reset()
		if err := f.write(&buf, comp, &Manifest{}); err != nil {
			return err
		}
	}
	if err := atomicfile.Write(entry, buf.Bytes(), atomicfile.Options{Mode: 0o644, DirMode: 0o755}); err != nil {
		return fmt.Errorf("initramfs cache: %w", err)
	}
	if !pulled && shared != nil {
		shared.Put(name, func(w io.Writer) error {
			_, err := w.Write(buf.Bytes())
			return err
		})
	}
	if _, err := w.Write(buf.Bytes()); err != nil {
		return fmt.Errorf("write initramfs: %w", err)
	}
	return nil
}

// cacheEntryRE is the name of an archive the cache keeps (Spec.CacheDir).
var cacheEntryRE = regexp.MustCompile(`^[0-9a-f]{64}\.(` + Zstd + `|` + Gzip + `)$`)

// UnusedCache lists the archives of the cache dir (Spec.CacheDir) not used or written since
// before, and the files of writes left unfinished since before, for kiln cache prune to remove.
// Other files are not the cache's and are not listed.
func UnusedCache(dir string, before time.Time) ([]string, error) {
	return lastuse.Unused(dir, before, lastuse.Files(cacheEntryRE), nil)
}

// holdsStream reports whether the compressed archive data decompresses to a cpio stream
// whose SHA-256 is sum.
func holdsStream(data []byte, sum string) bool {
	rc, err := openArchive(bytes.NewReader(data))
	if err != nil {
		return false
	}
	defer rc.Close()
	h := sha256.New()
	if _, err := io.Copy(h, rc); err != nil {
		return false
	}
	return hex.EncodeToString(h.Sum(nil)) == sum
}

// records are the archive's records by name (relative, e.g. "etc/kiln/modules.load").
type records map[string]cpio.Record

func (f records) addFile(name string, data []byte, perm uint64) {
	f[name] = cpio.StaticRecord(data, cpio.Info{Name: name, Mode: cpio.S_IFREG | perm})
}

// addModules adds the module files mods (in load order), modules.dep and the list of
// modules to load, and returns that list (absolute paths inside the initramfs).
func (f records) addModules(kmods *kernelModules, mods []string, kver string) ([]string, error) {
	inRoot := path.Join("lib/modules", kver)
	var load []string
	for _, m := range mods {
		data, err := kmods.readFile(m)
		if err != nil {
			return nil, fmt.Errorf("read kernel module: %w", err)
		}
		name := path.Join(inRoot, m)
		f.addFile(name, data, 0o644)
		load = append(load, "/"+name)
	}
	dep, err := kmods.readFile("modules.dep")
	if err != nil {
		return nil, fmt.Errorf("read module dependencies: %w", err)
	}
	f.addFile(path.Join(inRoot, "modules.dep"), dep, 0o644)
	var list bytes.Buffer
	for _, l := range load {
		list.WriteString(l + "\n")
	}
	f.addFile(strings.TrimPrefix(nodeimage.ModulesLoadPath, "/"), list.Bytes(), 0o644)
	return load, nil
}

// addDevicesAndDirs adds /dev/console, /dev/null, the parent directory of every record and
// the directories stage 1 needs.
func (f records) addDevicesAndDirs() {
	f["dev/console"] = cpio.CharDev("dev/console", 0o600, 5, 1)
	f["dev/null"] = cpio.CharDev("dev/null", 0o666, 1, 3)

	// Every parent directory gets its own record: the kernel's unpacker
	// does not create missing parents.
	for name := range f {
		for d := path.Dir(name); d != "."; d = path.Dir(d) {
			if _, ok := f[d]; !ok {
				f[d] = cpio.Directory(d, 0o755)
			}
		}
	}
	for _, d := range baseDirs {
		if _, ok := f[d]; !ok {
			f[d] = cpio.Directory(d, 0o755)
		}
	}
	f["tmp"] = cpio.Directory("tmp", 0o1777)
}

// write writes the records to w as a newc cpio archive compressed with comp, in lexical
// order (which puts every directory before its contents), and lists them in man.Entries.
func (f records) write(w io.Writer, comp string, man *Manifest) error {
	names := make([]string, 0, len(f))
	for n := range f {
		names = append(names, n)
	}
	sort.Strings(names)

	cw, finish, err := compressor(w, comp)
	if err != nil {
		return err
	}
	rw := cpio.Newc.Writer(cw)
	for i, n := range names {
		r := f[n]
		r.Ino = uint64(i + 1)
		r.NLink = 1
		if r.Mode&cpio.S_IFMT == cpio.S_IFDIR {
			r.NLink = 2
		}
		if err := rw.WriteRecord(r); err != nil {
			return fmt.Errorf("write initramfs record %s: %w", n, err)
		}
		man.Entries = append(man.Entries, entry{Name: "/" + n, Mode: r.Mode, Size: int64(r.FileSize), Major: r.Rmajor, Minor: r.Rminor})
	}
	if err := cpio.WriteTrailer(rw); err != nil {
		return fmt.Errorf("write initramfs trailer: %w", err)
	}
	if err := finish(); err != nil {
		return fmt.Errorf("finish %s initramfs stream: %w", comp, err)
	}
	return nil
}

// readStaticInit reads the init binary and checks that it is a statically
// linked ELF executable: the initramfs has no dynamic loader, and a dynamic
// /init makes the kernel panic with a message that does not name the cause.
func readStaticInit(name string) ([]byte, error) {
	data, err := os.ReadFile(name)
	if err != nil {
		return nil, fmt.Errorf("read init binary: %w", err)
	}
	f, err := elf.NewFile(bytes.NewReader(data))
	if err != nil {
		return nil, fmt.Errorf("init binary %s is not an ELF executable: %w", name, err)
	}
	defer f.Close()
	if f.Type != elf.ET_EXEC && f.Type != elf.ET_DYN {
		return nil, fmt.Errorf("init binary %s is an ELF %s, not an executable", name, f.Type)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return nil, fmt.Errorf("init binary %s is dynamically linked; build it static (CGO_ENABLED=0)", name)
		}
	}
	return data, nil
}

func compressor(w io.Writer, comp string) (io.Writer, func() error, error) {
	switch comp {
	case Zstd:
		// One goroutine keeps the output independent of scheduling; an
		// 8 MiB window is well within what the kernel's unzstd accepts.
		zw, err := zstd.NewWriter(w, zstd.WithEncoderLevel(zstd.SpeedBetterCompression),
			zstd.WithEncoderConcurrency(1), zstd.WithWindowSize(8<<20))
		if err != nil {
			return nil, nil, fmt.Errorf("zstd encoder: %w", err)
		}
		return zw, zw.Close, nil
	case Gzip:
		gw, err := gzip.NewWriterLevel(w, gzip.BestCompression)
		if err != nil {
			return nil, nil, fmt.Errorf("gzip encoder: %w", err)
		}
		return gw, gw.Close, nil
	default:
		return w, func() error { return nil }, nil
	}
}

// openArchive returns a reader of the uncompressed cpio stream of an initramfs
// written by Write, whatever its compression (detected from magic bytes).
func openArchive(r io.Reader) (io.ReadCloser, error) {
	br := bufioReader{r: r}
	head, err := br.peek(4)
	if err != nil {
		return nil, fmt.Errorf("read initramfs header: %w", err)
	}
	switch kind := decompress.ByMagic(head); {
	case kind == decompress.Zstd || kind == decompress.Gzip:
		rc, err := decompress.Open(&br, kind)
		if err != nil {
			return nil, fmt.Errorf("%s initramfs: %w", kind, err)
		}
		return rc, nil
	case string(head) == "0707":
		return io.NopCloser(&br), nil
	}
	return nil, fmt.Errorf("initramfs: unknown format (first bytes % x)", head)
}

// bufioReader lets openArchive look at the first bytes and then read them again.
type bufioReader struct {
	r    io.Reader
	head []byte
}

func (b *bufioReader) peek(n int) ([]byte, error) {
	b.head = make([]byte, n)
	m, err := io.ReadFull(b.r, b.head)
	b.head = b.head[:m]
	if err != nil {
		return nil, err
	}
	return b.head, nil
}

func (b *bufioReader) Read(p []byte) (int, error) {
	if len(b.head) > 0 {
		n := copy(p, b.head)
		b.head = b.head[n:]
		return n, nil
	}
	return b.r.Read(p)
}

// listArchive reads back the records of an initramfs written by Write.
func listArchive(r io.Reader) ([]entry, map[string][]byte, error) {
	rc, err := openArchive(r)
	if err != nil {
		return nil, nil, err
	}
	defer rc.Close()
	raw, err := io.ReadAll(rc)
	if err != nil {
		return nil, nil, fmt.Errorf("decompress initramfs: %w", err)
	}
	rr := cpio.EOFReader{RecordReader: cpio.Newc.Reader(bytes.NewReader(raw))}
	var entries []entry
	contents := map[string][]byte{}
	err = cpio.ForEachRecord(rr, func(rec cpio.Record) error {
		name := "/" + cpio.Normalize(rec.Name)
		entries = append(entries, entry{Name: name, Mode: rec.Mode, Size: int64(rec.FileSize), Major: rec.Rmajor, Minor: rec.Rminor})
		if rec.Mode&cpio.S_IFMT == cpio.S_IFREG {
			b, err := io.ReadAll(io.NewSectionReader(rec.ReaderAt, 0, int64(rec.FileSize)))
			if err != nil {
				return fmt.Errorf("read %s: %w", name, err)
			}
			contents[name] = b
		}
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("read initramfs cpio: %w", err)
	}
	return entries, contents, nil
}
