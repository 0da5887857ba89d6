package bake

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/kilnproject/kiln/initd/systemd"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

// imageContents records what a node config may rely on in the tree at root (see
// nodeimage.Contents): the locations a node writes, the users and groups, the unit files, the
// programs.
func imageContents(root string) (*nodeimage.Contents, error) {
	c := &nodeimage.Contents{}
	// Stage 1 puts a persistent overlay on each of these that is a directory in the root.
	for _, o := range nodeimage.Overlays() {
		if fi, err := os.Lstat(filepath.Join(root, o.Dir)); err == nil && fi.IsDir() {
			c.Writable = append(c.Writable, o.Dir)
		}
	}
	c.Writable = append(c.Writable, "/var")
	// /home and /root are writable where they link into /var, as the default base has them.
	for _, d := range []string{"/home", "/root"} {
		t, err := os.Readlink(filepath.Join(root, d))
		if err != nil {
			continue
		}
		if !filepath.IsAbs(t) {
			t = filepath.Join("/", t)
		}
		if t == "/var" || strings.HasPrefix(filepath.Clean(t), "/var/") {
			c.Writable = append(c.Writable, d)
		}
	}
	var err error
	if c.Users, err = names(root, "etc/passwd"); err != nil {
		return nil, err
	}
	if c.Groups, err = names(root, "etc/group"); err != nil {
		return nil, err
	}
	if c.Units, err = systemd.UnitFiles(root); err != nil {
		return nil, fmt.Errorf("unit files: %w", err)
	}
	if err := programs(root, c); err != nil {
		return nil, err
	}
	return c, nil
}

// programs records in c the programs of the tree at root, read below root only: the
// executable files and the links in each of nodeimage.ProgramDirList that is a directory (not
// followed through a link), and the top-level links into /usr by which other paths name them.
func programs(root string, c *nodeimage.Contents) error {
	r, err := os.OpenRoot(root)
	if err != nil {
		return err
	}
	defer r.Close()
	c.Links = map[string]string{}
	tops, err := os.ReadDir(root)
	if err != nil {
		return fmt.Errorf("programs: %w", err)
	}
	for _, e := range tops {
		if e.Type()&fs.ModeSymlink == 0 {
			continue
		}
		t, err := r.Readlink(e.Name())
		if err != nil {
			return fmt.Errorf("programs: %w", err)
		}
		if !path.IsAbs(t) {
			t = "/" + t
		}
		if t = path.Clean(t); strings.HasPrefix(t, "/usr/") {
			c.Links["/"+e.Name()] = t
		}
	}
	c.ProgramDirs, c.Programs = []string{}, []string{}
	for _, dir := range nodeimage.ProgramDirList() {
		rel := strings.TrimPrefix(dir, "/")
		fi, err := r.Lstat(rel)
		if errors.Is(err, fs.ErrNotExist) || (err == nil && !fi.IsDir()) {
			continue
		}
		if err != nil {
			return fmt.Errorf("programs: %w", err)
		}
		d, err := r.Open(rel)
		if err != nil {
			return fmt.Errorf("programs: %w", err)
		}
		names, err := d.Readdirnames(-1)
		d.Close()
		if err != nil {
			return fmt.Errorf("programs: %s: %w", dir, err)
		}
		slices.Sort(names)
		c.ProgramDirs = append(c.ProgramDirs, dir)
		for _, name := range names {
			info, err := r.Lstat(path.Join(rel, name))
			if err != nil {
				return fmt.Errorf("programs: %w", err)
			}
			if info.Mode()&fs.ModeSymlink != 0 || (info.Mode().IsRegular() && info.Mode()&0o111 != 0) {
				c.Programs = append(c.Programs, path.Join(dir, name))
			}
		}
	}
	return nil
}

// names are the first fields of the passwd or group file p of the tree at root, read below
// root only (a link out of the tree is an error, not the host's file); none when it is absent.
func names(root, p string) ([]string, error) {
	r, err := os.OpenRoot(root)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	f, err := r.Open(p)
	if errors.Is(err, fs.ErrNotExist) {
		return []string{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read /%s: %w", p, err)
	}
	defer f.Close()
	out := []string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if name, _, ok := strings.Cut(sc.Text(), ":"); ok && name != "" && !strings.HasPrefix(name, "#") {
			out = append(out, name)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read /%s: %w", p, err)
	}
	return out, nil
}
