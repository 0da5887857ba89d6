package liveroot

import (
	"bufio"
	"cmp"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

const defaultMemInfo = "/proc/meminfo"

// room is how many bytes the image may take in Dir: the space left on Dir's tmpfs (a ramfs has
// no limit of its own), and no more than the kernel's MemAvailable less reserve. Dir on any
// other filesystem is an error: the image must live in RAM.
func (f Fetcher) room() (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(f.Dir, &st); err != nil {
		return 0, fmt.Errorf("statfs %s: %w", f.Dir, err)
	}
	mem, err := memAvailable(cmp.Or(f.memInfo, defaultMemInfo))
	if err != nil {
		return 0, err
	}
	reserve := cmp.Or(f.reserve, defaultReserve)
	room := mem - reserve
	switch int64(st.Type) {
	case unix.TMPFS_MAGIC:
		room = min(room, int64(st.Bavail)*st.Bsize)
	case unix.RAMFS_MAGIC:
	default:
		return 0, fmt.Errorf("%s is on a filesystem of type %#x, not tmpfs or ramfs: the image must be fetched into RAM", f.Dir, st.Type)
	}
	if room <= 0 {
		return 0, fmt.Errorf("no RAM free for the image: %s available, %s kept for the system", size(mem), size(reserve))
	}
	return room, nil
}

// memAvailable reads MemAvailable from a meminfo file, in bytes.
func memAvailable(path string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, fmt.Errorf("free memory: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		v, ok := strings.CutPrefix(sc.Text(), "MemAvailable:")
		if !ok {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("free memory: %s: MemAvailable %q: %w", path, v, err)
		}
		return kb << 10, nil
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("free memory: %s: %w", path, err)
	}
	return 0, fmt.Errorf("free memory: %s has no MemAvailable line", path)
}
