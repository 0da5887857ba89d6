// Package lastuse records when a cache entry was last used, as its file's modification time,
// so that kiln cache prune can remove what no bake has used for a while. The entries are only
// ever replaced whole, never written in place, so their modification time is free to carry it.
package lastuse

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/kilnproject/kiln/internal/atomicfile"
)

// Mark records that the entry at p was used now. A cache kiln cannot write (another user's,
// mounted read-only) is still used, only not marked: prune then goes by the entry's write time.
func Mark(p string) {
	now := time.Now()
	_ = os.Chtimes(p, now, now)
}

// Files is an ours for Unused: the regular files whose names re matches, and the temporary
// files of writes (atomicfile's) that a crash left unfinished.
func Files(re *regexp.Regexp) func(fs.DirEntry) bool {
	return func(e fs.DirEntry) bool {
		return e.Type().IsRegular() && (re.MatchString(e.Name()) || strings.HasPrefix(e.Name(), atomicfile.TempPrefix))
	}
}

// Unused lists the entries of the cache directory dir that ours says are the cache's and that
// were not used since before, each going by the file that marking (the entry's path) names: the
// entry itself when marking is nil. A dir that does not exist has none.
func Unused(dir string, before time.Time, ours func(fs.DirEntry) bool, marking func(entry string) string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("cache %s: %w", dir, err)
	}
	var out []string
	for _, e := range ents {
		if !ours(e) {
			continue
		}
		p := filepath.Join(dir, e.Name())
		mark := p
		if marking != nil {
			mark = marking(p)
		}
		fi, err := os.Lstat(mark)
		if err != nil {
			return nil, fmt.Errorf("last use of %s: %w", mark, err)
		}
		if fi.ModTime().Before(before) {
			out = append(out, p)
		}
	}
	return out, nil
}
