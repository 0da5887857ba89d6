package rootfs

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Shared is a store of cache entries that several machines share (kiln bake --cache-repo): a
// tree the local cache lacks is taken from it, and one stored here is added to it. Both
// methods are best effort and report their own failures: a miss, a store that cannot be
// reached, or an entry that fails its checks all make Get return false, and the caller makes
// the entry itself.
type Shared interface {
	// Get streams entry key to read and reports whether the store held it whole and
	// verified. When it returns false, whatever read took from the stream must be discarded.
	Get(key string, read func(io.Reader) error) bool
	// Put adds the stream write makes to the store under key.
	Put(key string, write func(io.Writer) error)
}

// pull takes entry key from c.Shared into the cache, checked as Open checks an entry, and
// returns its record; it reports whether it did.
func (c TreeCache) pull(key string) (treeRecord, bool) {
	var r treeRecord
	if c.Shared == nil {
		return r, false
	}
	_, rec, err := c.paths(key)
	if err != nil {
		return r, false
	}
	if err := os.MkdirAll(c.Dir, 0o700); err != nil {
		return r, false
	}
	tmp, err := os.MkdirTemp(c.Dir, ".pull-")
	if err != nil {
		return r, false
	}
	defer os.RemoveAll(tmp)
	entry := filepath.Join(tmp, "entry")
	if !c.Shared.Get(sharedKey(key), func(rd io.Reader) error {
		if err := importEntry(rd, entry); err != nil {
			return err
		}
		r, err = checkEntry(filepath.Join(entry, "tree.json"), filepath.Join(entry, "tree"))
		return err
	}) {
		return r, false
	}
	os.RemoveAll(filepath.Dir(rec)) // a partial entry (no tree.json) left by a crash
	return r, os.Rename(entry, filepath.Dir(rec)) == nil
}

// push adds entry key of the cache to c.Shared.
func (c TreeCache) push(key string) {
	if c.Shared == nil {
		return
	}
	tree, rec, err := c.paths(key)
	if err != nil {
		return
	}
	c.Shared.Put(sharedKey(key), func(w io.Writer) error { return exportEntry(w, rec, tree) })
}

// sharedKey is what entry key is called in a Shared store: the key and the version of its
// record, so that kilns that keep trees differently do not take each other's.
func sharedKey(key string) string { return fmt.Sprintf("%s.v%d", key, treeRecordVersion) }

// exportEntry writes a cache entry as a tar stream: its record as tree.json, then every entry
// of its tree below tree/ in walk order, with its mode (and the sticky, setgid and setuid
// bits) and modification time. Files that are one inode are one file and hard links to it, as
// the tree has them; owners are the record's, not the files'.
func exportEntry(w io.Writer, record, tree string) error {
	tw := tar.NewWriter(w)
	data, err := os.ReadFile(record)
	if err != nil {
		return err
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "tree.json", Mode: 0o600, Size: int64(len(data)), ModTime: time.Unix(0, 0), Format: tar.FormatPAX}); err != nil {
		return err
	}
	if _, err := tw.Write(data); err != nil {
		return err
	}
	type inode struct{ dev, ino uint64 }
	seen := map[inode]string{}
	err = filepath.WalkDir(tree, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(tree, p)
		if err != nil {
			return err
		}
		name := path.Join("tree", filepath.ToSlash(rel))
		hdr := &tar.Header{Name: name, Mode: int64(unixMode(info.Mode())), ModTime: info.ModTime(), Format: tar.FormatPAX}
		if st, ok := info.Sys().(*syscall.Stat_t); ok && !info.IsDir() {
			k := inode{uint64(st.Dev), st.Ino}
			if first, ok := seen[k]; ok {
				hdr.Typeflag, hdr.Linkname = tar.TypeLink, first
				return tw.WriteHeader(hdr)
			}
			seen[k] = name
		}
		switch {
		case info.IsDir():
			hdr.Typeflag = tar.TypeDir
			return tw.WriteHeader(hdr)
		case info.Mode()&fs.ModeSymlink != 0:
			hdr.Typeflag = tar.TypeSymlink
			if hdr.Linkname, err = os.Readlink(p); err != nil {
				return err
			}
			return tw.WriteHeader(hdr)
		case info.Mode().IsRegular():
			hdr.Typeflag, hdr.Size = tar.TypeReg, info.Size()
			if err := tw.WriteHeader(hdr); err != nil {
				return err
			}
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			defer f.Close()
			if _, err := io.Copy(tw, f); err != nil {
				return fmt.Errorf("%s: %w", p, err)
			}
			return nil
		default:
			return fmt.Errorf("%s: not a directory, file or symlink", p)
		}
	})
	if err != nil {
		return fmt.Errorf("export cached tree %s: %w", tree, err)
	}
	return tw.Close()
}

// importEntry makes dir (which must not exist) from a stream exportEntry wrote. It refuses any
// name but tree.json, tree and what is below tree, a name that climbs out, a hard link to a
// name not seen before, and any other type of entry; every change goes through an os.Root on
// dir, so a symlink in the stream cannot redirect a later entry out of it.
func importEntry(r io.Reader, dir string) error {
	if err := os.Mkdir(dir, 0o700); err != nil {
		return err
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	type dirTime struct {
		name string
		t    time.Time
	}
	var dirs []dirTime
	seen := map[string]bool{}
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("cache entry: %w", err)
		}
		name := hdr.Name
		if path.Clean(name) != name || (name != "tree.json" && name != "tree" && !strings.HasPrefix(name, "tree/")) {
			return fmt.Errorf("cache entry: unexpected name %q", hdr.Name)
		}
		if err := importMember(root, tr, hdr, seen); err != nil {
			return fmt.Errorf("cache entry %s: %w", name, err)
		}
		seen[name] = true
		if hdr.Typeflag == tar.TypeDir {
			dirs = append(dirs, dirTime{name, hdr.ModTime})
		}
	}
	if !seen["tree.json"] || !seen["tree"] {
		return errors.New("cache entry: no tree.json or no tree")
	}
	// Directory times last: making their entries changed them.
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := root.Chtimes(dirs[i].name, dirs[i].t, dirs[i].t); err != nil {
			return fmt.Errorf("cache entry %s: %w", dirs[i].name, err)
		}
	}
	return nil
}

// importMember makes one member of a cache entry in root.
func importMember(root *os.Root, tr *tar.Reader, hdr *tar.Header, seen map[string]bool) error {
	mode := fs.FileMode(hdr.Mode).Perm() | specialBits(hdr.Mode)
	switch hdr.Typeflag {
	case tar.TypeDir:
		if hdr.Name == "tree.json" {
			return errors.New("a directory")
		}
		if err := root.Mkdir(hdr.Name, 0o700); err != nil {
			return err
		}
		return root.Chmod(hdr.Name, mode)
	case tar.TypeReg:
		if err := writeRegular(root, hdr.Name, tr, mode); err != nil {
			return err
		}
		return root.Chtimes(hdr.Name, hdr.ModTime, hdr.ModTime)
	case tar.TypeSymlink:
		return root.Symlink(hdr.Linkname, hdr.Name)
	case tar.TypeLink:
		if !seen[hdr.Linkname] || !strings.HasPrefix(hdr.Linkname, "tree/") {
			return fmt.Errorf("hard link to %q, not an earlier file of the tree", hdr.Linkname)
		}
		return root.Link(hdr.Linkname, hdr.Name)
	default:
		return fmt.Errorf("entry type %q", hdr.Typeflag)
	}
}
