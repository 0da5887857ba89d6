package spec

import (
	"fmt"
	"strconv"
	"strings"
)

// Size is a number of bytes. In documents it is written as a plain integer
// (bytes) or an integer with a unit: B, KiB, MiB, GiB, TiB (powers of 1024)
// or KB, MB, GB, TB (powers of 1000), e.g. "4GiB", "512MiB", "1073741824".
type Size int64

// Common sizes.
const (
	kib Size = 1 << 10
	mib Size = 1 << 20
	gib Size = 1 << 30
	tib Size = 1 << 40
)

var sizeUnits = []struct {
	name string
	mult Size
}{
	{"TiB", tib}, {"GiB", gib}, {"MiB", mib}, {"KiB", kib},
	{"TB", 1e12}, {"GB", 1e9}, {"MB", 1e6}, {"KB", 1e3},
	{"B", 1},
}

// parseSize parses "4GiB", "512 MiB", "100MB" or "1048576".
func parseSize(s string) (Size, error) {
	t := strings.TrimSpace(s)
	mult := Size(1)
	for _, u := range sizeUnits {
		if strings.HasSuffix(t, u.name) {
			t, mult = strings.TrimSpace(strings.TrimSuffix(t, u.name)), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("invalid size %q: want a whole number of bytes or one with a unit (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB), e.g. 4GiB", s)
	}
	if n > int64((1<<63-1)/mult) {
		return 0, fmt.Errorf("invalid size %q: too large", s)
	}
	return Size(n) * mult, nil
}

// String formats s with the largest binary unit that divides it exactly.
func (s Size) String() string {
	for _, u := range sizeUnits[:4] {
		if s != 0 && s%u.mult == 0 {
			return strconv.FormatInt(int64(s/u.mult), 10) + u.name
		}
	}
	return strconv.FormatInt(int64(s), 10) + "B"
}

// Bytes returns s as an int64.
func (s Size) Bytes() int64 { return int64(s) }
