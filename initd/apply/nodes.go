package apply

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"

	"github.com/coreos/ignition/v2/config/v3_6/types"

	"github.com/kilnproject/kiln/initd/config"
	"github.com/kilnproject/kiln/initd/rootpath"
	"github.com/kilnproject/kiln/internal/atomicfile"
)

// Directories creates storage.directories entries below root: a missing directory gets
// mode 0755 unless given and owner root unless given; an existing directory gets the
// mode and owner the entry gives (and keeps what it does not give); a non-directory in
// the way is replaced only with overwrite: true. It returns the node paths it changed.
func Directories(ctx context.Context, root string, dirs []types.Directory) ([]string, error) {
	t, err := openTree(root)
	if err != nil {
		return nil, err
	}
	defer t.Close()
	var changed []string
	for i, d := range dirs {
		if err := ctx.Err(); err != nil {
			return changed, err
		}
		field := fmt.Sprintf("storage.directories[%d]", i)
		p := path.Clean("/" + d.Path)
		c, err := t.directory(field, d)
		if err != nil {
			return changed, fmt.Errorf("%s (%s): %w", field, p, err)
		}
		if c {
			changed = append(changed, p)
		}
	}
	return changed, nil
}

func (t *tree) directory(field string, d types.Directory) (bool, error) {
	uid, gid, err := t.owner(field, config.NodeUser(d.User), config.NodeGroup(d.Group))
	if err != nil {
		return false, err
	}
	dir, base, err := t.split(d.Path)
	if err != nil {
		return false, err
	}
	target := path.Join(dir, base)
	mode := fs.FileMode(0o755)
	if d.Mode != nil {
		mode = config.UnixMode(*d.Mode)
	}
	fi, err := t.root.Lstat(target)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return false, fmt.Errorf("stat: %w", err)
	case fi.IsDir():
		return t.setMeta(target, fi, mode, d.Mode == nil, uid, gid)
	case d.Overwrite == nil || !*d.Overwrite:
		return false, fmt.Errorf("exists and is %s, not a directory, and overwrite is false", rootpath.TypeName(fi.Mode()))
	default:
		if err := t.root.Remove(target); err != nil {
			return false, fmt.Errorf("replace %s: %w", rootpath.TypeName(fi.Mode()), err)
		}
	}
	if err := t.mkdir(target, mode, uid, gid); err != nil {
		return false, err
	}
	return true, t.syncDir(dir)
}

// Links creates storage.links entries below root. A symbolic link's target is written
// as given (absolute targets mean node paths, relative ones are relative to the link's
// directory); a hard link's target is an absolute node path that must exist. An existing
// link that already points at the target (the same inode, for hard links) is left alone
// (its owner corrected if one is given); anything else at the path is replaced only with
// overwrite: true, and a directory never. It returns the node paths it changed.
func Links(ctx context.Context, root string, links []types.Link) ([]string, error) {
	t, err := openTree(root)
	if err != nil {
		return nil, err
	}
	defer t.Close()
	var changed []string
	for i, l := range links {
		if err := ctx.Err(); err != nil {
			return changed, err
		}
		field := fmt.Sprintf("storage.links[%d]", i)
		p := path.Clean("/" + l.Path)
		c, err := t.link(field, l)
		if err != nil {
			return changed, fmt.Errorf("%s (%s): %w", field, p, err)
		}
		if c {
			changed = append(changed, p)
		}
	}
	return changed, nil
}

func (t *tree) link(field string, l types.Link) (bool, error) {
	if l.Target == nil || *l.Target == "" {
		return false, &config.FieldError{Path: field + ".target", Err: errors.New("is required")}
	}
	target := *l.Target
	hard := l.Hard != nil && *l.Hard
	uid, gid, err := t.owner(field, config.NodeUser(l.User), config.NodeGroup(l.Group))
	if err != nil {
		return false, err
	}
	dir, base, err := t.split(l.Path)
	if err != nil {
		return false, err
	}
	p := path.Join(dir, base)

	var hardTarget string
	var hardInfo fs.FileInfo
	if hard {
		tdir, tbase, err := t.splitExisting(target)
		if err != nil {
			return false, &config.FieldError{Path: field + ".target", Err: err}
		}
		hardTarget = path.Join(tdir, tbase)
		if hardInfo, err = t.root.Lstat(hardTarget); err != nil {
			return false, &config.FieldError{Path: field + ".target", Err: fmt.Errorf("hard link target %s: %w", target, err)}
		}
		if hardInfo.IsDir() {
			return false, &config.FieldError{Path: field + ".target", Err: fmt.Errorf("hard link target %s is a directory", target)}
		}
	}

	fi, err := t.root.Lstat(p)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return false, fmt.Errorf("stat: %w", err)
	case !hard && fi.Mode()&fs.ModeSymlink != 0 && t.readlink(p) == target:
		return t.setMeta(p, fi, 0, true, uid, gid)
	case hard && os.SameFile(fi, hardInfo):
		return false, nil
	case fi.IsDir():
		return false, fmt.Errorf("is a directory; kiln does not replace directories with links")
	case l.Overwrite == nil || !*l.Overwrite:
		return false, fmt.Errorf("exists (%s) and is not the wanted link, and overwrite is false", rootpath.TypeName(fi.Mode()))
	}
	// Make the link under a temporary name and rename it into place, so that the path
	// never is missing.
	err = atomicfile.PlaceIn(t.root, p, func(tmp string) error {
		if hard {
			return t.root.Link(hardTarget, tmp)
		}
		if err := t.root.Symlink(target, tmp); err != nil {
			return err
		}
		if t.asRoot {
			return t.root.Lchown(tmp, max(uid, 0), max(gid, 0))
		}
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("link: %w", err)
	}
	return true, nil
}

// splitExisting resolves the directory of the node path p without creating anything.
func (t *tree) splitExisting(p string) (dir, base string, err error) {
	r := rel(p)
	if r == "" {
		return "", "", errors.New("path is the root directory")
	}
	dir, err = t.resolve(path.Dir(r), false)
	if err != nil {
		return "", "", err
	}
	return dir, path.Base(r), nil
}

func (t *tree) readlink(p string) string {
	s, err := t.root.Readlink(p)
	if err != nil {
		return ""
	}
	return s
}
