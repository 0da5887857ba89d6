package systemd

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"
)

// newRoot builds a Debian-like root: /lib is a symlink to usr/lib (merged /usr), and
// the given unit files live in /usr/lib/systemd/system unless their key names a dir.
func newRoot(t *testing.T, units map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for _, d := range []string{"usr/lib/systemd/system", "etc/systemd/system"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("usr/lib", filepath.Join(root, "lib")); err != nil {
		t.Fatal(err)
	}
	for name, body := range units {
		p := filepath.Join(root, "usr/lib/systemd/system", name)
		if strings.Contains(name, "/") {
			p = filepath.Join(root, name)
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// links lists every symlink under /etc/systemd/system as "path -> target".
func links(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	base := filepath.Join(root, ConfigDir)
	err := filepath.WalkDir(base, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type()&fs.ModeSymlink != 0 {
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(base, p)
			out = append(out, rel+" -> "+target)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(out)
	return out
}

const (
	svc     = "[Unit]\nDescription=a\n[Service]\nExecStart=/bin/true\n"
	install = "\n[Install]\nWantedBy=multi-user.target\n"
)

func TestParseInstall(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want Install
	}{
		{"none", svc, Install{}},
		{"wanted by", svc + install, Install{WantedBy: []string{"multi-user.target"}}},
		{"all keys, repeats and lists", "[Install]\nWantedBy=a.target b.target\nWantedBy=c.target\nRequiredBy=d.target\nUpheldBy=e.target\nAlias=x.service\nAlso=y.socket\nDefaultInstance=tty1\n",
			Install{WantedBy: []string{"a.target", "b.target", "c.target"}, RequiredBy: []string{"d.target"}, UpheldBy: []string{"e.target"},
				Alias: []string{"x.service"}, Also: []string{"y.socket"}, DefaultInstance: "tty1"}},
		{"empty assignment resets", "[Install]\nWantedBy=a.target\nWantedBy=\nWantedBy=b.target\n", Install{WantedBy: []string{"b.target"}}},
		{"comments, spaces, other sections", "[Install]\n# WantedBy=no.target\n; WantedBy=no.target\n  WantedBy = a.target  \n[X-Other]\nWantedBy=no.target\n",
			Install{WantedBy: []string{"a.target"}}},
		{"continuation", "[Install]\nWantedBy=a.target \\\n  b.target\n", Install{WantedBy: []string{"a.target", "b.target"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseInstall(strings.NewReader(tc.in))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("ParseInstall = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestEnable(t *testing.T) {
	tests := []struct {
		name      string
		units     map[string]string
		enable    string
		wantLinks []string
		wantErr   error
		errText   string
	}{
		{name: "wanted by", units: map[string]string{"a.service": svc + install}, enable: "a.service",
			wantLinks: []string{"multi-user.target.wants/a.service -> /usr/lib/systemd/system/a.service"}},
		{name: "required, upheld, alias", units: map[string]string{"a.service": svc + "[Install]\nRequiredBy=x.target\nUpheldBy=y.target\nAlias=b.service\n"}, enable: "a.service",
			wantLinks: []string{"b.service -> /usr/lib/systemd/system/a.service", "x.target.requires/a.service -> /usr/lib/systemd/system/a.service", "y.target.upholds/a.service -> /usr/lib/systemd/system/a.service"}},
		{name: "unit in /etc wins", units: map[string]string{"a.service": svc + install, "etc/systemd/system/a.service": svc + "[Install]\nWantedBy=x.target\n"}, enable: "a.service",
			wantLinks: []string{"x.target.wants/a.service -> /etc/systemd/system/a.service"}},
		{name: "found through an absolute /lib symlink", units: map[string]string{"opt/units/lib/systemd/system/z.service": svc + install}, enable: "z.service",
			wantLinks: []string{"multi-user.target.wants/z.service -> /lib/systemd/system/z.service"}},
		{name: "also", units: map[string]string{"a.service": svc + "[Install]\nWantedBy=multi-user.target\nAlso=a.socket\n", "a.socket": "[Install]\nWantedBy=sockets.target\nAlso=a.service\n"}, enable: "a.service",
			wantLinks: []string{"multi-user.target.wants/a.service -> /usr/lib/systemd/system/a.service", "sockets.target.wants/a.socket -> /usr/lib/systemd/system/a.socket"}},
		{name: "template instance", units: map[string]string{"getty@.service": svc + "[Install]\nWantedBy=getty.target\n"}, enable: "getty@tty2.service",
			wantLinks: []string{"getty.target.wants/getty@tty2.service -> /usr/lib/systemd/system/getty@.service"}},
		{name: "template default instance", units: map[string]string{"getty@.service": svc + "[Install]\nWantedBy=getty.target\nDefaultInstance=tty1\n"}, enable: "getty@.service",
			wantLinks: []string{"getty.target.wants/getty@tty1.service -> /usr/lib/systemd/system/getty@.service"}},
		{name: "template without default", units: map[string]string{"getty@.service": svc + "[Install]\nWantedBy=getty.target\n"}, enable: "getty@.service",
			errText: "template without DefaultInstance="},
		{name: "static", units: map[string]string{"s.service": svc}, enable: "s.service", wantErr: errNoInstall},
		{name: "missing", enable: "m.service", wantErr: ErrNotFound, errText: "looked in /etc/systemd/system, /usr/lib/systemd/system, /lib/systemd/system"},
		{name: "bad name", enable: "../x.service", errText: "contains a slash"},
		{name: "no suffix", enable: "sshd", errText: "no unit type suffix"},
		{name: "masked", units: map[string]string{"a.service": svc + install}, enable: "a.service", wantErr: errMasked},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			root := newRoot(t, tc.units)
			if tc.name == "found through an absolute /lib symlink" {
				os.Remove(filepath.Join(root, "lib"))
				if err := os.Symlink("/opt/units/lib", filepath.Join(root, "lib")); err != nil {
					t.Fatal(err)
				}
			}
			if tc.name == "masked" {
				if _, err := Mask(root, "a.service"); err != nil {
					t.Fatal(err)
				}
			}
			changed, err := Enable(root, tc.enable)
			if tc.wantErr != nil || tc.errText != "" {
				if err == nil || (tc.wantErr != nil && !errors.Is(err, tc.wantErr)) || !strings.Contains(err.Error(), tc.errText) {
					t.Fatalf("Enable error = %v, want %v %q", err, tc.wantErr, tc.errText)
				}
				return
			}
			if err != nil || !changed {
				t.Fatalf("Enable = %v, %v; want true, nil", changed, err)
			}
			if got := links(t, root); !reflect.DeepEqual(got, tc.wantLinks) {
				t.Errorf("links = %q\nwant    %q", got, tc.wantLinks)
			}
			if ok, err := isEnabled(root, tc.enable); !ok || err != nil {
				t.Errorf("IsEnabled = %v, %v", ok, err)
			}
			// Idempotent: a second run changes nothing.
			if changed, err := Enable(root, tc.enable); changed || err != nil {
				t.Errorf("second Enable = %v, %v; want false, nil", changed, err)
			}
			// Disable removes exactly what Enable made.
			if changed, err := Disable(root, tc.enable); !changed || err != nil {
				t.Errorf("Disable = %v, %v; want true, nil", changed, err)
			}
			if got := links(t, root); len(got) != 0 {
				t.Errorf("links after Disable = %q", got)
			}
			if changed, err := Disable(root, tc.enable); changed || err != nil {
				t.Errorf("second Disable = %v, %v; want false, nil", changed, err)
			}
		})
	}
}

func TestEnableReplacesStaleLink(t *testing.T) {
	root := newRoot(t, map[string]string{"a.service": svc + install})
	stale := filepath.Join(root, ConfigDir, "multi-user.target.wants")
	os.MkdirAll(stale, 0o755)
	if err := os.Symlink("/old/a.service", filepath.Join(stale, "a.service")); err != nil {
		t.Fatal(err)
	}
	if changed, err := Enable(root, "a.service"); !changed || err != nil {
		t.Fatalf("Enable = %v, %v", changed, err)
	}
	want := []string{"multi-user.target.wants/a.service -> /usr/lib/systemd/system/a.service"}
	if got := links(t, root); !reflect.DeepEqual(got, want) {
		t.Errorf("links = %q, want %q", got, want)
	}
	// A regular file in the way is never clobbered.
	os.Remove(filepath.Join(stale, "a.service"))
	os.WriteFile(filepath.Join(stale, "a.service"), []byte("x"), 0o644)
	if _, err := Enable(root, "a.service"); err == nil || !strings.Contains(err.Error(), "exists (a regular file)") {
		t.Errorf("Enable over a file = %v", err)
	}
}

func TestDisableLeavesOthers(t *testing.T) {
	root := newRoot(t, map[string]string{"a.service": svc + install, "b.service": svc + install})
	for _, u := range []string{"a.service", "b.service"} {
		if _, err := Enable(root, u); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := Disable(root, "a.service"); err != nil {
		t.Fatal(err)
	}
	want := []string{"multi-user.target.wants/b.service -> /usr/lib/systemd/system/b.service"}
	if got := links(t, root); !reflect.DeepEqual(got, want) {
		t.Errorf("links = %q, want %q", got, want)
	}
	// Disabling a unit that does not exist anywhere is a no-op.
	if changed, err := Disable(root, "ghost.service"); changed || err != nil {
		t.Errorf("Disable(ghost) = %v, %v", changed, err)
	}
}

func TestMask(t *testing.T) {
	root := newRoot(t, map[string]string{"a.service": svc + install, "etc/systemd/system/local.service": svc})
	tests := []struct {
		name        string
		op          func(root, unit string) (bool, error)
		unit        string
		wantChanged bool
		errText     string
	}{
		{"mask", Mask, "a.service", true, ""},
		{"mask again", Mask, "a.service", false, ""},
		{"mask a missing unit", Mask, "nothing.service", true, ""},
		{"mask over a unit file in /etc", Mask, "local.service", false, "kiln does not mask over a unit file"},
		{"unmask", Unmask, "a.service", true, ""},
		{"unmask again", Unmask, "a.service", false, ""},
		{"unmask leaves a unit file", Unmask, "local.service", false, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			changed, err := tc.op(root, tc.unit)
			if tc.errText != "" {
				if err == nil || !strings.Contains(err.Error(), tc.errText) {
					t.Fatalf("error = %v, want %q", err, tc.errText)
				}
				return
			}
			if err != nil || changed != tc.wantChanged {
				t.Fatalf("= %v, %v; want %v, nil", changed, err, tc.wantChanged)
			}
		})
	}
	if isMasked(root, "a.service") || !isMasked(root, "nothing.service") {
		t.Error("IsMasked disagrees with Mask/Unmask")
	}
	if _, err := os.Stat(filepath.Join(root, ConfigDir, "local.service")); err != nil {
		t.Errorf("unit file in /etc was touched: %v", err)
	}
}
