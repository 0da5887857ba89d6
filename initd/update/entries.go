package update

import (
	"bufio"
	"cmp"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/kilnproject/kiln/internal/atomicfile"
	"github.com/kilnproject/kiln/internal/cmdline"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

// DefaultTries is how many boots a new slot gets before systemd-boot gives up on it.
const DefaultTries = 3

// entryRE matches kiln's boot entries with systemd-boot's boot counting: kiln-<slot>.conf
// (blessed, or the bake's), kiln-<slot>+<left>.conf (not tried yet) and
// kiln-<slot>+<left>-<done>.conf (tried).
var entryRE = regexp.MustCompile(`^kiln-([ab])(?:\+(\d+)(?:-(\d+))?)?\.conf$`)

// Entry is one of kiln's boot entries on the ESP.
type Entry struct {
	// File is its name in loader/entries.
	File string
	// Slot is the slot letter, a or b.
	Slot string
	// Counting is set while the entry is on trial; TriesLeft and TriesDone are then its
	// counters (TriesLeft 0: systemd-boot gave up on it).
	Counting             bool
	TriesLeft, TriesDone int
	// SortKey and Version order the entries as systemd-boot does: entries with a sort key
	// before those without (the bake's), then the highest version first.
	SortKey, Version string
	// Options is the kernel command line.
	Options string
}

// Bad says whether systemd-boot gave up on the entry: no tries left.
func (e Entry) Bad() bool { return e.Counting && e.TriesLeft == 0 }

// Generation is the entry's version as a number, 0 for the bake's entry.
func (e Entry) Generation() int {
	n, _ := strconv.Atoi(e.Version)
	return n
}

// RootHash is the kiln.verity.roothash= of the entry's command line.
func (e Entry) RootHash() string {
	v, _ := cmdline.Parse(e.Options).Lookup("kiln." + nodeimage.VerityRootHashKey)
	return v
}

// entryFile names the entry file of slot with tries boots to go (0: blessed, no counting).
func entryFile(slot string, tries int) string {
	if tries <= 0 {
		return "kiln-" + slot + ".conf"
	}
	return fmt.Sprintf("kiln-%s+%d.conf", slot, tries)
}

// blessedFile is the entry's name once blessed: the counters dropped.
func (e Entry) blessedFile() string { return entryFile(e.Slot, 0) }

// readEntries reads kiln's entries in esp's loader/entries; other files are left alone.
func readEntries(esp string) ([]Entry, error) {
	dir := filepath.Join(esp, nodeimage.LoaderEntriesDir)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read boot entries: %w", err)
	}
	var out []Entry
	for _, de := range ents {
		m := entryRE.FindStringSubmatch(de.Name())
		if m == nil {
			continue
		}
		e := Entry{File: de.Name(), Slot: m[1]}
		if m[2] != "" {
			e.Counting = true
			e.TriesLeft, _ = strconv.Atoi(m[2])
			if m[3] != "" {
				e.TriesDone, _ = strconv.Atoi(m[3])
			}
		}
		if err := e.read(filepath.Join(dir, de.Name())); err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return out, nil
}

func (e *Entry) read(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		key, val, _ := strings.Cut(strings.TrimSpace(sc.Text()), " ")
		val = strings.TrimSpace(val)
		switch key {
		case "sort-key":
			e.SortKey = val
		case "version":
			e.Version = val
		case "options":
			e.Options = val
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("read boot entry %s: %w", path, err)
	}
	return nil
}

// order sorts entries as systemd-boot 252 does for kiln's: entries without tries left last,
// then those with a sort key first, then the highest version, then the name downwards; the
// first is what a default of "kiln-*" boots.
func order(entries []Entry) []Entry {
	out := slices.Clone(entries)
	slices.SortStableFunc(out, func(a, b Entry) int {
		if r := cmp.Compare(b2i(a.Bad()), b2i(b.Bad())); r != 0 {
			return r
		}
		if r := cmp.Compare(b2i(a.SortKey == ""), b2i(b.SortKey == "")); r != 0 {
			return r
		}
		if a.SortKey != "" && b.SortKey != "" {
			if r := strings.Compare(a.SortKey, b.SortKey); r != 0 {
				return r
			}
			if r := cmp.Compare(b.Generation(), a.Generation()); r != 0 {
				return r
			}
		}
		return strings.Compare(b.File, a.File)
	})
	return out
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Default is the entry systemd-boot boots next, with ok false when there is none.
func Default(entries []Entry) (Entry, bool) {
	o := order(entries)
	if len(o) == 0 {
		return Entry{}, false
	}
	return o[0], true
}

// entryText is a boot entry's content.
func entryText(title string, generation int, slot, options string) string {
	return fmt.Sprintf("title %s\nsort-key kiln\nversion %d\nlinux %s\ninitrd %s\noptions %s\n",
		title, generation, slotKernel(slot), slotInitrd(slot), options)
}

// slotKernel, slotInitrd and slotImageJSON are a slot's files on the ESP (slot a's kernel and
// initramfs are where the bake put them).
func slotKernel(slot string) string    { return "/kiln/" + slot + "/vmlinuz" }
func slotInitrd(slot string) string    { return "/kiln/" + slot + "/initrd.img" }
func slotImageJSON(slot string) string { return "/kiln/" + slot + "/image.json" }

// loaderConf is loader.conf once a node has been updated: the default is the first of kiln's
// entries in systemd-boot's order, which drops an entry out of tries to the end.
const loaderConf = "default kiln-*\ntimeout 0\n"

// atomicWrite replaces a small file on the ESP through a temporary name.
func atomicWrite(path, text string) error {
	return atomicfile.Write(path, []byte(text), atomicfile.Options{Mode: 0o644})
}
