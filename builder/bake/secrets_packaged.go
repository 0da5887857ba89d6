package bake

import (
	"crypto/md5"
	"encoding/hex"
	"io"
	"io/fs"
	"path"
	"strings"
)

// dropPackaged leaves out the findings in files that the image's dpkg database records with
// the same content (its md5sums and conffiles): a distribution's package shipped them to
// everyone.
func dropPackaged(fsys fs.FS, findings []Finding) []Finding {
	sums := dpkgSums(fsys)
	if len(sums) == 0 {
		return findings
	}
	packaged := map[string]bool{}
	out := findings[:0]
	for _, f := range findings {
		p := strings.TrimPrefix(f.Path, "/")
		is, ok := packaged[p]
		if !ok {
			is = sums[p] != "" && fileMD5(fsys, p) == sums[p]
			packaged[p] = is
		}
		if !is {
			out = append(out, f)
		}
	}
	return out
}

// dpkgSums maps the files of the image's installed packages (paths relative to the root,
// with symlinked top directories — /bin, /lib of a merged /usr — resolved) to their md5.
func dpkgSums(fsys fs.FS) map[string]string {
	sums := map[string]string{}
	top := map[string]string{}
	canon := func(p string) string {
		p = strings.TrimPrefix(path.Clean("/"+p), "/")
		first, rest, found := strings.Cut(p, "/")
		if !found {
			return p
		}
		t, ok := top[first]
		if !ok {
			t = first
			if l, err := fs.ReadLink(fsys, first); err == nil && !path.IsAbs(l) && !strings.HasPrefix(path.Clean(l), "..") {
				t = path.Clean(l)
			}
			top[first] = t
		}
		return t + "/" + rest
	}
	files, _ := fs.Glob(fsys, "var/lib/dpkg/info/*.md5sums")
	for _, f := range files {
		b, err := fs.ReadFile(fsys, f)
		if err != nil {
			continue
		}
		for line := range strings.Lines(string(b)) {
			sum, p, ok := strings.Cut(strings.TrimRight(line, "\n"), "  ")
			if ok && len(sum) == 32 {
				sums[canon(p)] = sum
			}
		}
	}
	if b, err := fs.ReadFile(fsys, "var/lib/dpkg/status"); err == nil {
		in := false
		for line := range strings.Lines(string(b)) {
			line = strings.TrimRight(line, "\n")
			switch {
			case strings.HasPrefix(line, "Conffiles:"):
				in = true
			case in && strings.HasPrefix(line, " "):
				if f := strings.Fields(line); len(f) >= 2 && len(f[1]) == 32 {
					sums[canon(f[0])] = f[1]
				}
			default:
				in = false
			}
		}
	}
	return sums
}

func fileMD5(fsys fs.FS, p string) string {
	f, err := fsys.Open(p)
	if err != nil {
		return ""
	}
	defer f.Close()
	h := md5.New()
	if _, err := io.Copy(h, f); err != nil {
		return ""
	}
	return hex.EncodeToString(h.Sum(nil))
}
