package testkit

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Node is what a tree snapshot records of one file, directory or symlink.
type Node struct {
	Mode     fs.FileMode
	UID, GID uint32
	Nlink    uint64
	Size     int64
	MTime    time.Time
	Content  string // SHA-256 of a regular file's bytes, a symlink's target, else empty
}

// String shows n in a diff.
func (n Node) String() string {
	return fmt.Sprintf("%v %d:%d nlink %d size %d mtime %s %s", n.Mode, n.UID, n.GID, n.Nlink, n.Size,
		n.MTime.Format(time.RFC3339Nano), n.Content)
}

// Tree maps the slash-separated path of every entry below a root, relative to it ("." is
// the root itself), to what it was when snapshotted.
type Tree map[string]Node

// Snapshot records every file, directory and symlink below root: type, mode, owner, link
// count, size, modification time, content hash and link target. It does not follow
// symlinks.
func Snapshot(t testing.TB, root string) Tree {
	t.Helper()
	tree := Tree{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		n := Node{Mode: fi.Mode(), Size: fi.Size(), MTime: fi.ModTime()}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			n.UID, n.GID, n.Nlink = st.Uid, st.Gid, uint64(st.Nlink)
		}
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			n.Content, err = os.Readlink(p)
		case fi.Mode().IsRegular():
			var b []byte
			b, err = os.ReadFile(p)
			sum := sha256.Sum256(b)
			n.Content = hex.EncodeToString(sum[:])
		}
		rel, _ := filepath.Rel(root, p)
		tree[filepath.ToSlash(rel)] = n
		return err
	})
	if err != nil {
		t.Fatalf("snapshot %s: %v", root, err)
	}
	return tree
}

// identical reports whether a and b agree in everything a snapshot records.
func identical(a, b Node) bool {
	return SameContent(a, b) && a.UID == b.UID && a.GID == b.GID && a.Nlink == b.Nlink &&
		a.Size == b.Size && a.MTime.Equal(b.MTime)
}

// SameContent reports whether a and b have the same type, mode and content (bytes of a
// file, target of a symlink).
func SameContent(a, b Node) bool {
	return a.Mode == b.Mode && a.Content == b.Content
}

// Diff lists, sorted, the entries added to, removed from, or changed in b compared with a;
// same says whether two snapshots of one entry count as unchanged (nil: identical).
func (a Tree) Diff(b Tree, same func(x, y Node) bool) []string {
	if same == nil {
		same = identical
	}
	var diffs []string
	for p, x := range a {
		y, ok := b[p]
		switch {
		case !ok:
			diffs = append(diffs, "removed "+p)
		case !same(x, y):
			diffs = append(diffs, fmt.Sprintf("changed %s: %v -> %v", p, x, y))
		}
	}
	for p := range b {
		if _, ok := a[p]; !ok {
			diffs = append(diffs, "added "+p)
		}
	}
	sort.Strings(diffs)
	return diffs
}

// Unchanged fails the test if the tree at root differs in anything from before (taken
// with Snapshot): for a sentinel directory that a hostile input must not reach.
func (a Tree) Unchanged(t testing.TB, root string) {
	t.Helper()
	if d := a.Diff(Snapshot(t, root), nil); len(d) > 0 {
		t.Errorf("%s changed:\n%s", root, strings.Join(d, "\n"))
	}
}
