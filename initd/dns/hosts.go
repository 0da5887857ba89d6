package dns

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/kilnproject/kiln/internal/atomicfile"
)

// The lines around the block of /etc/hosts that Hosts manages.
const (
	hostsBegin = "# BEGIN kiln (managed by kiln-init; do not edit)"
	hostsEnd   = "# END kiln"
)

// defaultHostsPath is the file Hosts edits unless told otherwise.
const defaultHostsPath = "/etc/hosts"

// Hosts publishes records in the node's own hosts file, for clusters without DNS: in
// a block between hostsBegin and hostsEnd, one "address<TAB>name" line per address.
// Only that block is ever changed (it is appended when missing); the file is replaced
// atomically (temporary file with the same mode and owner, renamed over it) and only
// when the block's contents change, so an unchanged file keeps its mtime.
type Hosts struct {
	// Root is the node's "/" (a temporary directory in tests); "" is "/".
	Root string
	// Path is the hosts file below Root; defaultHostsPath when empty.
	Path string
}

// Name implements Provider.
func (p *Hosts) Name() string { return "hosts " + p.nodePath() }

func (p *Hosts) nodePath() string {
	if p.Path == "" {
		return defaultHostsPath
	}
	return p.Path
}

func (p *Hosts) file() string {
	root := p.Root
	if root == "" {
		root = "/"
	}
	return filepath.Join(root, p.nodePath())
}

type hostsEntry struct {
	addr netip.Addr
	name string
}

// hostsFile is a hosts file split around the kiln block.
type hostsFile struct {
	before, after []byte
	entries       []hostsEntry
	hasBlock      bool
}

func (p *Hosts) read() (*hostsFile, fs.FileInfo, error) {
	path := p.file()
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return &hostsFile{}, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("hosts: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return nil, nil, fmt.Errorf("hosts: %s is not a regular file (%s); kiln does not replace it", p.nodePath(), fi.Mode().Type())
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("hosts: %w", err)
	}
	h, err := parseHosts(data)
	if err != nil {
		return nil, nil, fmt.Errorf("hosts: %s:%w", p.nodePath(), err)
	}
	return h, fi, nil
}

func parseHosts(data []byte) (*hostsFile, error) {
	h := &hostsFile{}
	lines := bytes.SplitAfter(data, []byte("\n"))
	begin, end := -1, -1
	for i, l := range lines {
		switch strings.TrimSpace(string(l)) {
		case hostsBegin:
			if begin >= 0 {
				return nil, fmt.Errorf("%d: a second %q (the first is on line %d)", i+1, hostsBegin, begin+1)
			}
			begin = i
		case hostsEnd:
			if begin < 0 || end >= 0 {
				return nil, fmt.Errorf("%d: %q without %q before it", i+1, hostsEnd, hostsBegin)
			}
			end = i
		}
	}
	if begin >= 0 && end < 0 {
		return nil, fmt.Errorf("%d: %q without %q after it", begin+1, hostsBegin, hostsEnd)
	}
	if begin < 0 {
		h.before = data
		return h, nil
	}
	h.hasBlock = true
	h.before = bytes.Join(lines[:begin], nil)
	h.after = bytes.Join(lines[end+1:], nil)
	for _, l := range lines[begin+1 : end] {
		f := strings.Fields(string(l))
		if len(f) < 2 || strings.HasPrefix(f[0], "#") {
			continue
		}
		a, err := netip.ParseAddr(f[0])
		if err != nil {
			continue
		}
		for _, n := range f[1:] {
			if strings.HasPrefix(n, "#") {
				break
			}
			h.entries = append(h.entries, hostsEntry{a, HostName(n)})
		}
	}
	return h, nil
}

func (h *hostsFile) block() []byte {
	var b bytes.Buffer
	b.WriteString(hostsBegin + "\n")
	for _, e := range h.entries {
		fmt.Fprintf(&b, "%s\t%s\n", e.addr, e.name)
	}
	b.WriteString(hostsEnd + "\n")
	return b.Bytes()
}

func (h *hostsFile) bytes() []byte {
	var b bytes.Buffer
	b.Write(h.before)
	if len(h.before) > 0 && !bytes.HasSuffix(h.before, []byte("\n")) {
		b.WriteByte('\n')
	}
	b.Write(h.block())
	b.Write(h.after)
	return b.Bytes()
}

// Upsert implements Provider.
func (p *Hosts) Upsert(ctx context.Context, recs []Record) error {
	if err := checkRecords(recs); err != nil {
		return err
	}
	h, fi, err := p.read()
	if err != nil {
		return err
	}
	old := slices.Clone(h.entries)
	for _, r := range recs {
		name, v4 := HostName(r.Name), r.Type == TypeA
		h.entries = slices.DeleteFunc(h.entries, func(e hostsEntry) bool {
			if e.name != name || e.addr.Is4() != v4 {
				return false
			}
			return !r.Shared || slices.Contains(r.Stale, e.addr) || slices.Contains(r.Addrs, e.addr)
		})
		for _, a := range r.Addrs {
			h.entries = append(h.entries, hostsEntry{a, name})
		}
	}
	slices.SortFunc(h.entries, func(a, b hostsEntry) int {
		if c := strings.Compare(a.name, b.name); c != 0 {
			return c
		}
		return a.addr.Compare(b.addr)
	})
	h.entries = slices.Compact(h.entries)
	if h.hasBlock && slices.Equal(old, h.entries) {
		return nil
	}
	return p.write(h.bytes(), fi)
}

// write replaces the hosts file with data, keeping mode and owner of the file fi
// describes (0644 root:root for a new one).
func (p *Hosts) write(data []byte, fi fs.FileInfo) error {
	path := p.file()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("hosts: %w", err)
	}
	opts := atomicfile.Options{Mode: 0o644, Chown: os.Geteuid() == 0}
	if fi != nil {
		opts.Mode = fi.Mode().Perm()
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			opts.UID, opts.GID = int(st.Uid), int(st.Gid)
		}
	}
	if err := atomicfile.Write(path, data, opts); err != nil {
		return fmt.Errorf("hosts %s: %w", p.nodePath(), err)
	}
	return nil
}

// Lookup implements Provider: the addresses of name in the kiln block.
func (p *Hosts) Lookup(ctx context.Context, name string) ([]netip.Addr, error) {
	h, _, err := p.read()
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, e := range h.entries {
		if e.name == HostName(name) {
			out = append(out, e.addr)
		}
	}
	return out, nil
}
