package apply

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"path"
	"time"

	"github.com/kilnproject/kiln/initd/config"
	"github.com/kilnproject/kiln/initd/rootpath"
	"github.com/kilnproject/kiln/internal/fetch"
)

// Files writes storage.files entries (from config.Config.Files) below root. Remote
// contents are fetched with get first (all of them, before anything is written; a nil
// get uses HTTPGetter(http.DefaultClient)) and must match their verification hash; all
// contents together may not exceed config.MaxFilesSize.
//
// The rules are Ignition's, plus one that makes re-runs converge:
//   - a missing file is created (empty when the entry has no contents), mode 0644 unless
//     given, owned by root unless given;
//   - an existing regular file that already holds the wanted contents is not rewritten:
//     only its mode and owner are corrected where they differ (mtime is kept);
//   - an existing node with other contents is replaced only with overwrite: true,
//     otherwise it is an error; a directory is never replaced;
//   - an entry without contents leaves an existing regular file's contents alone (mode and
//     owner are applied if given).
//
// It returns the node paths it changed, in config order.
func Files(ctx context.Context, root string, files []config.File, get config.Getter) ([]string, error) {
	if get == nil {
		get = HTTPGetter(http.DefaultClient)
	}
	t, err := openTree(root)
	if err != nil {
		return nil, err
	}
	defer t.Close()
	resolved := make([]config.File, len(files))
	var total int64 // held in memory: bounded by config.MaxFilesSize
	for i, f := range files {
		if f.Remote() {
			// A file already holding the verified contents needs no download: a re-run
			// works offline.
			if data, ok := t.holds(f); ok {
				f.Contents, f.Source = data, ""
			}
		}
		rf, err := f.Fetch(ctx, get)
		if err != nil {
			return nil, err
		}
		if total += int64(len(rf.Contents)); total > config.MaxFilesSize {
			return nil, config.FilesTotalError(rf.Field)
		}
		resolved[i] = rf
	}
	var changed []string
	for _, f := range resolved {
		c, err := t.file(f)
		if err != nil {
			return changed, fmt.Errorf("%s (%s): %w", f.Field, f.Path, err)
		}
		if c {
			changed = append(changed, f.Path)
		}
	}
	return changed, nil
}

func (t *tree) file(f config.File) (bool, error) {
	uid, gid, err := t.owner(f.Field, f.User, f.Group)
	if err != nil {
		return false, err
	}
	dir, base, err := t.split(f.Path)
	if err != nil {
		return false, err
	}
	target := path.Join(dir, base)
	fi, err := t.root.Lstat(target)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return false, fmt.Errorf("stat: %w", err)
	}
	exists := err == nil
	mode := fs.FileMode(0o644)
	if f.ModeSet {
		mode = f.Mode
	}
	switch {
	case !exists:
		return true, t.writeFile(dir, base, f.Contents, mode, uid, gid)
	case fi.IsDir():
		return false, errors.New("is a directory; kiln does not replace directories with files")
	case !f.HasContents:
		if !fi.Mode().IsRegular() {
			return false, fmt.Errorf("exists and is %s, not a regular file", rootpath.TypeName(fi.Mode()))
		}
		return t.setMeta(target, fi, mode, !f.ModeSet, uid, gid)
	case fi.Mode().IsRegular() && t.sameContents(target, fi, f.Contents):
		// Already written (by an earlier run, or the image): keep the file and its
		// mtime; set mode and owner. Without overwrite and without a mode, Ignition
		// keeps an existing file's mode.
		return t.setMeta(target, fi, mode, !f.ModeSet && !f.Overwrite, uid, gid)
	case !f.Overwrite:
		return false, fmt.Errorf("already exists (%s) with other contents and overwrite is false", rootpath.TypeName(fi.Mode()))
	}
	return true, t.writeFile(dir, base, f.Contents, mode, uid, gid)
}

// holds returns the contents of f's path when it is a regular file whose contents match
// f's verification hash.
func (t *tree) holds(f config.File) ([]byte, bool) {
	dir, err := t.resolve(path.Dir(rel(f.Path)), false)
	if err != nil {
		return nil, false
	}
	p := path.Join(dir, path.Base(f.Path))
	fi, err := t.root.Lstat(p)
	if err != nil || !fi.Mode().IsRegular() || fi.Size() > config.MaxSize {
		return nil, false
	}
	data, err := t.root.ReadFile(p)
	if err != nil {
		return nil, false
	}
	return data, f.Hash != "" && config.VerifyHash(f.Hash, data) == nil
}

// sameContents reports whether the regular file p holds exactly data.
func (t *tree) sameContents(p string, fi fs.FileInfo, data []byte) bool {
	if fi.Size() != int64(len(data)) {
		return false
	}
	cur, err := t.root.ReadFile(p)
	return err == nil && bytes.Equal(cur, data)
}

// HTTPGetter fetches http(s) URLs with client, once. A status other than 200 is an error;
// bodies larger than config.MaxSize are refused; redirects follow fetch.CheckRedirect (at
// most fetch.MaxRedirects, never from https to http) before client's own policy.
func HTTPGetter(client *http.Client) config.Getter {
	return func(ctx context.Context, url string) ([]byte, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return nil, err
		}
		resp, err := fetch.Do(client, req)
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		if err := fetch.CheckStatus(resp, time.Now()); err != nil {
			return nil, err
		}
		data, err := io.ReadAll(io.LimitReader(resp.Body, config.MaxSize+1))
		if err != nil {
			return nil, fmt.Errorf("read body: %w", err)
		}
		if len(data) > config.MaxSize {
			return nil, &config.TooLargeError{What: "the answer", Limit: config.MaxSize}
		}
		return data, nil
	}
}
