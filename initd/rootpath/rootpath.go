// Package rootpath resolves paths inside a node's root directory the way the node itself
// would, with that root as "/": absolute symlinks point back inside it and ".." stops at it.
// kiln-init writes into roots that are not "/" (tests, a mounted image), and the builder
// flattens untrusted image layers into a directory, so every writer resolves through here
// before it touches anything.
//
// It is built on os.Root rather than replaced by it: os.Root keeps every access inside the root
// but refuses an absolute symlink, or a ".." that climbs past the root, as an escape, while an
// image is full of absolute symlinks (/var/run -> /run, /etc/localtime ->
// /usr/share/zoneinfo/UTC) that mean the image's own root. Resolve gives them that meaning and
// returns a symlink-free path; callers then act on that path through the same os.Root, so even
// a tree changed behind their back cannot send them outside it.
//
// The builder imports this package: resolving a path inside an image tree is node-side logic
// (what the node's "/" means), and the bake resolves it exactly as the node does. It is node
// code first and must never import builder/.
package rootpath

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"
)

// maxSymlinks bounds the symlinks followed in one path, as the kernel does (40).
const maxSymlinks = 40

// Resolve follows p (relative to r's directory) component by component and returns a path
// relative to it that contains no symlinks. A missing component is created with mkdir (given
// its path relative to the root) when mkdir is not nil; otherwise it is an error that wraps
// fs.ErrNotExist. A component before the last that is not a directory is an error.
func Resolve(r *os.Root, p string, mkdir func(rel string) error) (string, error) {
	todo := strings.Split(p, "/")
	var cur []string
	links := 0
	for len(todo) > 0 {
		c := todo[0]
		todo = todo[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			if len(cur) > 0 {
				cur = cur[:len(cur)-1]
			}
			continue
		}
		next := path.Join(append(slices.Clone(cur), c)...)
		fi, err := r.Lstat(next)
		switch {
		case errors.Is(err, fs.ErrNotExist) && mkdir != nil:
			if err := mkdir(next); err != nil {
				return "", err
			}
			cur = append(cur, c)
		case err != nil:
			return "", fmt.Errorf("resolve /%s: %w", next, err)
		case fi.Mode()&fs.ModeSymlink != 0:
			if links++; links > maxSymlinks {
				return "", fmt.Errorf("resolve /%s: too many levels of symbolic links", p)
			}
			target, err := r.Readlink(next)
			if err != nil {
				return "", fmt.Errorf("read symlink /%s: %w", next, err)
			}
			if path.IsAbs(target) {
				cur = nil
			}
			todo = append(strings.Split(target, "/"), todo...)
		case fi.IsDir() || len(todo) == 0:
			cur = append(cur, c)
		default:
			return "", fmt.Errorf("/%s is not a directory", next)
		}
	}
	if len(cur) == 0 {
		return ".", nil
	}
	return path.Join(cur...), nil
}

// TypeName names the kind of node m describes ("a directory", "a symlink"), for messages
// about what is in a path's way.
func TypeName(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m.IsRegular():
		return "a regular file"
	case m&fs.ModeSymlink != 0:
		return "a symlink"
	}
	return "a " + m.Type().String() + " node"
}
