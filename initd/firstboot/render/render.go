// Package render writes a node's configuration files from templates: kubelet and
// container runtime configuration, static-pod manifests, systemd drop-ins. A template
// directory mirrors the destination paths with a ".tmpl" suffix
// (etc/kubernetes/kubelet-config.yaml.tmpl becomes /etc/kubernetes/kubelet-config.yaml)
// and templates are Go text/template with Data as the dot and a few functions (see
// funcs). Images carry their role's templates in /usr/lib/kiln/templates.
//
// A template whose output is only white space writes no file (as Helm's): a part of the
// role this node does not run, such as the etcd member of a control plane whose etcd is
// external.
//
// Rendering is all or nothing and idempotent: every template is executed before any file
// is written, a reference to a missing field or map key is an error naming the template
// and line, and a file whose content, mode and owner are already right is left alone (its
// mtime too).
//
// A file gets its template's permission bits without group and other write, unless the
// template starts with a mode directive, `{{- /* kiln:mode 0600 */ -}}` (git keeps only
// 0644 and 0755), and anything under /etc/kubernetes/pki is 0600. Files are created with
// their final mode, owned by root when kiln runs as root, and replaced atomically.
package render

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"text/template"

	"github.com/kilnproject/kiln/internal/atomicfile"
)

// suffix marks template files.
const suffix = ".tmpl"

// modeDirective matches the optional mode directive at the very start of a template.
var modeDirective = regexp.MustCompile(`^\{\{-?\s*/\*\s*kiln:mode\s+(0[0-7]{3})\s*\*/\s*-?\}\}`)

// file is one rendered template waiting to be written.
type file struct {
	src  string      // template path, for errors
	dest string      // node path below root, without the leading "/"
	data []byte      // rendered content
	mode fs.FileMode // permission bits
}

// Render executes every template below srcDir with data (after withDefaults) and
// writes the results below root. It returns the node paths ("/etc/…") it wrote, in
// lexical order; nil when everything was already up to date.
func Render(srcDir, root string, data Data) (changed []string, err error) {
	files, err := execute(srcDir, data.withDefaults())
	if err != nil {
		return nil, err
	}
	r, err := os.OpenRoot(root)
	if err != nil {
		return nil, fmt.Errorf("render: open root %s: %w", root, err)
	}
	defer r.Close()
	for _, f := range files {
		same, err := upToDate(r, f)
		if err != nil {
			return changed, fmt.Errorf("render %s: %w", f.src, err)
		}
		if same {
			continue
		}
		if err := write(r, f); err != nil {
			return changed, fmt.Errorf("render %s: %w", f.src, err)
		}
		changed = append(changed, "/"+f.dest)
	}
	return changed, nil
}

// execute parses and runs every template; it writes nothing.
func execute(srcDir string, data Data) ([]file, error) {
	var files []file
	found := 0
	err := filepath.WalkDir(srcDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return fmt.Errorf("render: %w", err)
		}
		if d.IsDir() {
			return nil
		}
		rel, err := filepath.Rel(srcDir, p)
		if err != nil {
			return fmt.Errorf("render: %w", err)
		}
		rel = filepath.ToSlash(rel)
		if !d.Type().IsRegular() {
			return fmt.Errorf("render: %s is not a regular file", p)
		}
		if !strings.HasSuffix(rel, suffix) || rel == suffix {
			return fmt.Errorf("render: %s is not a template (no %s suffix)", p, suffix)
		}
		f, err := executeOne(p, rel, data)
		if err != nil {
			return err
		}
		found++
		if len(bytes.TrimSpace(f.data)) > 0 {
			files = append(files, f)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if found == 0 {
		return nil, fmt.Errorf("render: no templates in %s", srcDir)
	}
	return files, nil
}

func executeOne(p, rel string, data Data) (file, error) {
	src, err := os.ReadFile(p)
	if err != nil {
		return file{}, fmt.Errorf("render: %w", err)
	}
	fi, err := os.Stat(p)
	if err != nil {
		return file{}, fmt.Errorf("render: %w", err)
	}
	f := file{src: p, dest: strings.TrimSuffix(rel, suffix), mode: fi.Mode().Perm() &^ 0o022}
	if m := modeDirective.FindSubmatch(src); m != nil {
		mode, _ := strconv.ParseUint(string(m[1]), 8, 32) // the pattern admits only octal
		f.mode = fs.FileMode(mode)
	}
	if f.dest == "etc/kubernetes/pki" || strings.HasPrefix(f.dest, "etc/kubernetes/pki/") {
		f.mode = 0o600
	}
	// The template's name is its path in srcDir, so errors read
	// "template: etc/kubernetes/kubelet-config.yaml.tmpl:12:5: …".
	t, err := template.New(rel).Option("missingkey=error").Funcs(funcs()).Parse(string(src))
	if err != nil {
		return file{}, fmt.Errorf("render %s: %w", p, err)
	}
	var buf bytes.Buffer
	if err := t.Execute(&buf, data); err != nil {
		return file{}, fmt.Errorf("render %s: %w", p, err)
	}
	f.data = buf.Bytes()
	return f, nil
}

// upToDate reports whether the file below r already has f's content, mode and (as root)
// owner. A symlink, directory or other non-regular file in its place is an error: kiln
// does not write through links it did not make.
func upToDate(r *os.Root, f file) (bool, error) {
	fi, err := r.Lstat(f.dest)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return false, nil
	case err != nil:
		return false, err
	case !fi.Mode().IsRegular():
		return false, fmt.Errorf("/%s exists and is not a regular file (%s)", f.dest, fi.Mode().Type())
	case fi.Mode().Perm() != f.mode || fi.Size() != int64(len(f.data)):
		return false, nil
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && os.Geteuid() == 0 && (st.Uid != 0 || st.Gid != 0) {
		return false, nil
	}
	old, err := r.ReadFile(f.dest)
	if err != nil {
		return false, err
	}
	return bytes.Equal(old, f.data), nil
}

// write replaces the file atomically (atomicfile): owned by root (as root) and given its
// mode before it gets its name.
func write(r *os.Root, f file) error {
	dir := path.Dir(f.dest)
	if err := r.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create directory /%s: %w", dir, err)
	}
	return atomicfile.WriteIn(r, f.dest, f.data, atomicfile.Options{Mode: f.mode, Chown: os.Geteuid() == 0})
}
