package etcdvolume

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"strings"

	"github.com/kilnproject/kiln/internal/atomicfile"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

// manifestPath is where a manifest is kept on the volume mounted at volumeDir:
// <volumeDir>/manifests/<name>.
func manifestPath(volumeDir, name string) string {
	return path.Join(volumeDir, "manifests", name)
}

// WriteManifest writes a static pod manifest onto the volume mounted at volumeDir
// (manifestPath, mode 0600), in root, unless it already holds data. It reports whether
// it wrote.
func WriteManifest(root, volumeDir, name string, data []byte) (changed bool, err error) {
	target, err := manifestTarget(volumeDir, name)
	if err != nil {
		return false, err
	}
	r, err := os.OpenRoot(root)
	if err != nil {
		return false, fmt.Errorf("write manifest %s: %w", target, err)
	}
	defer r.Close()
	changed, err = atomicfile.UpdateIn(r, strings.TrimPrefix(target, "/"), data, atomicfile.Options{Mode: 0o600})
	if err != nil {
		return false, fmt.Errorf("write manifest %s: %w", target, err)
	}
	return changed, nil
}

// LinkManifest makes /etc/kubernetes/manifests/<name> in root a symlink to the manifest
// kept on the volume mounted at volumeDir (manifestPath), so that the kubelet runs the
// pod only while the volume is mounted. It is idempotent: a link to the right place is
// left alone, a link elsewhere is replaced, and a regular file in the way is replaced
// only when it holds exactly the manifest on the volume (an error otherwise: it may be
// a manifest someone else wrote). It reports whether it changed anything.
func LinkManifest(root, volumeDir, name string) (changed bool, err error) {
	target, err := manifestTarget(volumeDir, name)
	if err != nil {
		return false, err
	}
	link := path.Join(nodeimage.ManifestsDir, name)
	fail := func(err error) (bool, error) {
		return false, fmt.Errorf("link manifest %s -> %s: %w", link, target, err)
	}
	r, err := os.OpenRoot(root)
	if err != nil {
		return fail(err)
	}
	defer r.Close()
	rel := strings.TrimPrefix(link, "/")
	fi, err := r.Lstat(rel)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return fail(err)
	case fi.Mode()&fs.ModeSymlink != 0:
		if dest, err := r.Readlink(rel); err == nil && dest == target {
			return false, nil
		}
	case fi.Mode().IsRegular():
		have, err := r.ReadFile(rel)
		if err != nil {
			return fail(err)
		}
		want, err := r.ReadFile(strings.TrimPrefix(target, "/"))
		if err != nil {
			return fail(fmt.Errorf("%s is a regular file in the way and the manifest on the volume cannot be read to compare: %w", link, err))
		}
		if !bytes.Equal(have, want) {
			return fail(fmt.Errorf("%s is a regular file that differs from the manifest on the volume; move it away", link))
		}
	default:
		kind := "a special file"
		if fi.IsDir() {
			kind = "a directory"
		}
		return fail(fmt.Errorf("%s is %s in the way", link, kind))
	}
	if err := r.MkdirAll(path.Dir(rel), 0o755); err != nil {
		return fail(err)
	}
	if err := atomicfile.PlaceIn(r, rel, func(tmp string) error { return r.Symlink(target, tmp) }); err != nil {
		return fail(err)
	}
	return true, nil
}

// manifestTarget checks volumeDir and name and returns manifestPath.
func manifestTarget(volumeDir, name string) (string, error) {
	switch {
	case !path.IsAbs(volumeDir) || path.Clean(volumeDir) != volumeDir || volumeDir == "/":
		return "", fmt.Errorf("manifest: volume directory %q must be a clean absolute path below /", volumeDir)
	case name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\x00"):
		return "", fmt.Errorf("manifest: %q is not a file name", name)
	}
	return manifestPath(volumeDir, name), nil
}
