package dns

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const hostsHead = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost\n"

// Records the hosts file tests register.
var (
	hostsEtcd  = Record{Name: "etcd-a.internal.prod.example.test.", Type: TypeA, Addrs: addrs("10.0.0.5"), TTL: 60}
	hostsEtcd6 = Record{Name: "etcd-a.internal.prod.example.test", Type: TypeAAAA, Addrs: addrs("fd00::5"), TTL: 60}
	hostsAPI   = Record{Name: "api.internal.prod.example.test", Type: TypeA, Addrs: addrs("10.0.0.5"), TTL: 60, Shared: true}
)

// hostsBlock is kiln's block in a hosts file holding lines.
func hostsBlock(lines ...string) string {
	return hostsBegin + "\n" + strings.Join(append(lines, ""), "\n") + hostsEnd + "\n"
}

// hostsCase is a hosts file before an Upsert of recs and what it holds after.
type hostsCase struct {
	name   string
	before string // "" and noFile: no file
	noFile bool
	recs   []Record
	want   string
}

var hostsCases = []hostsCase{
	{"block appended, the rest untouched", hostsHead, false, []Record{hostsEtcd, hostsEtcd6, hostsAPI},
		hostsHead + hostsBlock("10.0.0.5\tapi.internal.prod.example.test", "10.0.0.5\tetcd-a.internal.prod.example.test", "fd00::5\tetcd-a.internal.prod.example.test")},
	{"no final newline", "127.0.0.1 localhost", false, []Record{hostsEtcd},
		"127.0.0.1 localhost\n" + hostsBlock("10.0.0.5\tetcd-a.internal.prod.example.test")},
	{"missing file", "", true, []Record{hostsEtcd}, hostsBlock("10.0.0.5\tetcd-a.internal.prod.example.test")},
	{"block in the middle replaced, new IP replaces the old",
		hostsHead + hostsBlock("10.0.0.4\tetcd-a.internal.prod.example.test", "fd00::5\tetcd-a.internal.prod.example.test") + "# mine\n10.9.9.9 db\n", false,
		[]Record{hostsEtcd},
		hostsHead + hostsBlock("10.0.0.5\tetcd-a.internal.prod.example.test", "fd00::5\tetcd-a.internal.prod.example.test") + "# mine\n10.9.9.9 db\n"},
	{"shared name keeps the other nodes",
		hostsHead + hostsBlock("10.0.0.7\tapi.internal.prod.example.test", "10.0.0.8\tapi.internal.prod.example.test"), false,
		WithStale([]Record{hostsAPI}, []Record{{Name: hostsAPI.Name, Type: TypeA, Addrs: addrs("10.0.0.8"), TTL: 60, Shared: true}}),
		hostsHead + hostsBlock("10.0.0.5\tapi.internal.prod.example.test", "10.0.0.7\tapi.internal.prod.example.test")},
}

func TestHosts(t *testing.T) {
	for _, c := range hostsCases {
		t.Run(c.name, func(t *testing.T) {
			root := t.TempDir()
			path := filepath.Join(root, "etc", "hosts")
			if !c.noFile {
				os.MkdirAll(filepath.Dir(path), 0o755)
				if err := os.WriteFile(path, []byte(c.before), 0o640); err != nil {
					t.Fatal(err)
				}
			}
			p := &Hosts{Root: root}
			if err := p.Upsert(context.Background(), c.recs); err != nil {
				t.Fatal(err)
			}
			checkHostsFile(t, c, path)

			// Again: unchanged, so not rewritten (the mtime stays).
			old := time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)
			os.Chtimes(path, old, old)
			if err := p.Upsert(context.Background(), c.recs); err != nil {
				t.Fatal(err)
			}
			if fi, _ := os.Stat(path); !fi.ModTime().Equal(old) {
				t.Errorf("unchanged hosts file rewritten (mtime %v)", fi.ModTime())
			}
			for _, r := range c.recs {
				got, err := p.Lookup(context.Background(), r.Name)
				if err != nil {
					t.Fatal(err)
				}
				for _, a := range r.Addrs {
					if !strings.Contains(addrsString(got), a.String()) {
						t.Errorf("Lookup(%s) = %v, lacks %v", r.Name, got, a)
					}
				}
			}
		})
	}
}

// checkHostsFile checks the hosts file at path holds c.want, kept its mode (0644 when new) and
// no temporary file is left beside it.
func checkHostsFile(t *testing.T, c hostsCase, path string) {
	t.Helper()
	got, _ := os.ReadFile(path)
	if string(got) != c.want {
		t.Errorf("hosts:\n%s\nwant:\n%s", got, c.want)
	}
	fi, _ := os.Stat(path)
	wantMode := os.FileMode(0o640)
	if c.noFile {
		wantMode = 0o644
	}
	if fi.Mode().Perm() != wantMode {
		t.Errorf("mode %v, want %v", fi.Mode().Perm(), wantMode)
	}
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 1 {
		t.Errorf("temporary files left: %v", entries)
	}
}

func addrsString[T interface{ String() string }](s []T) string {
	var b strings.Builder
	for _, a := range s {
		b.WriteString(a.String() + " ")
	}
	return b.String()
}

func TestHostsRefusesBrokenBlock(t *testing.T) {
	cases := []struct{ name, data, want string }{
		{"begin without end", hostsHead + hostsBegin + "\n10.0.0.1 x\n", "/etc/hosts:3: \"" + hostsBegin + "\" without \"" + hostsEnd + "\" after it"},
		{"end without begin", hostsHead + hostsEnd + "\n", "/etc/hosts:3: \"" + hostsEnd + "\" without"},
		{"two blocks", hostsBegin + "\n" + hostsEnd + "\n" + hostsBegin + "\n" + hostsEnd + "\n", "/etc/hosts:3: a second"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			root := t.TempDir()
			path := filepath.Join(root, "etc", "hosts")
			os.MkdirAll(filepath.Dir(path), 0o755)
			os.WriteFile(path, []byte(c.data), 0o644)
			err := (&Hosts{Root: root}).Upsert(context.Background(), []Record{{Name: "a.example.test", Type: TypeA, Addrs: addrs("10.0.0.1"), TTL: 60}})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("err = %v, want %q", err, c.want)
			}
			if got, _ := os.ReadFile(path); string(got) != c.data {
				t.Errorf("file changed:\n%s", got)
			}
		})
	}
}
