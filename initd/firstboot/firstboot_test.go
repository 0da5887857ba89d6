package firstboot

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vincent-petithory/dataurl"

	"github.com/kilnproject/kiln/initd/source"
	"github.com/kilnproject/kiln/initd/task"
	"github.com/kilnproject/kiln/internal/testkit"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// clock returns a Now that starts at t0 and advances by step on every call.
func clock(step time.Duration) func() time.Time {
	now := t0.Add(-step)
	return func() time.Time { now = now.Add(step); return now }
}

// fwcfg puts cfg in a fake sysfs as QEMU's fw_cfg item and returns the provider.
func fwcfg(t *testing.T, cfg string) source.Provider {
	t.Helper()
	sys := t.TempDir()
	dir := filepath.Join(sys, "firmware", "qemu_fw_cfg", "by_name", "opt", "dev.kiln", "config")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "raw"), []byte(cfg), 0o400); err != nil {
		t.Fatal(err)
	}
	return &source.FWCfg{Sysfs: sys, LoadModule: func(context.Context) error { return errors.New("unexpected modprobe") }}
}

// noFWCfg is a machine without the fw_cfg device.
func noFWCfg(t *testing.T) source.Provider {
	return &source.FWCfg{Sysfs: t.TempDir(), LoadModule: func(context.Context) error { return errors.New("not QEMU") }}
}

func ignition(files ...string) string {
	return `{"ignition":{"version":"3.4.0"},"storage":{"files":[` + strings.Join(files, ",") + `]}}`
}

func sha256hex(data []byte) string {
	s := sha256.Sum256(data)
	return hex.EncodeToString(s[:])
}

func readStatusFile(t *testing.T, root string) (map[string]any, *Status) {
	t.Helper()
	p := filepath.Join(root, "var/lib/kiln/status.json")
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatalf("status.json: %v", err)
	}
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("status.json mode = %v, want 0600", fi.Mode().Perm())
	}
	var raw map[string]any
	if err := json.Unmarshal(data, &raw); err != nil {
		t.Fatalf("status.json is not JSON: %v\n%s", err, data)
	}
	var st Status
	if err := json.Unmarshal(data, &st); err != nil {
		t.Fatal(err)
	}
	return raw, &st
}

func TestRunAppliesFiles(t *testing.T) {
	root := t.TempDir()
	unit := []byte("[Service]\nType=oneshot\nExecStart=/bin/true\n")
	s512 := sha512.Sum512(unit)
	cfg := ignition(
		`{"path":"/etc/hostname","contents":{"source":"data:,node-1%0A"}}`,
		`{"path":"/etc/kiln/secret","mode":384,"contents":{"source":"data:;base64,czNjcjN0"}}`,
		fmt.Sprintf(`{"path":"/etc/systemd/system/demo.service","mode":420,"contents":{"source":%q,"compression":"gzip","verification":{"hash":"sha512-%s"}}}`,
			dataurl.EncodeBytes(testkit.Gzip(t, unit)), hex.EncodeToString(s512[:])),
		`{"path":"/usr/local/bin/tool","mode":493,"contents":{"source":"data:,%23!/bin/sh%0A"}}`,
		`{"path":"/etc/kiln/empty"}`,
	)
	// gzip'd whole config, as a user may pass it through fw_cfg.
	st, err := Run(context.Background(), Options{
		Root:      root,
		Providers: []source.Provider{fwcfg(t, string(testkit.Gzip(t, []byte(cfg)))), source.Embedded{Path: filepath.Join(root, "none")}},
		Now:       clock(1500 * time.Millisecond),
		Version:   "v0.1.0-test",
	})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if got, want := st.Line(), "kiln-init: firstboot ok source=fw_cfg files=5 tasks=19 applied=1 unchanged=18 failed=0 duration=1.5s"; got != want {
		t.Errorf("Line = %q, want %q", got, want)
	}

	checkAppliedFiles(t, root, unit)
	checkGoodBootStatus(t, root, unit)
}

// checkAppliedFiles checks the five files of TestRunAppliesFiles landed under root with their
// contents and modes, their directories are drwxr-xr-x and no temporary file is left.
func checkAppliedFiles(t *testing.T, root string, unit []byte) {
	t.Helper()
	wantFiles := []struct {
		path     string
		contents string
		mode     fs.FileMode
	}{
		{"/etc/hostname", "node-1\n", 0o644},
		{"/etc/kiln/secret", "s3cr3t", 0o600},
		{"/etc/systemd/system/demo.service", string(unit), 0o644},
		{"/usr/local/bin/tool", "#!/bin/sh\n", 0o755},
		{"/etc/kiln/empty", "", 0o644},
	}
	for _, w := range wantFiles {
		p := filepath.Join(root, w.path)
		data, err := os.ReadFile(p)
		if err != nil {
			t.Errorf("%s: %v", w.path, err)
			continue
		}
		if string(data) != w.contents {
			t.Errorf("%s = %q, want %q", w.path, data, w.contents)
		}
		fi, _ := os.Stat(p)
		if fi.Mode() != w.mode {
			t.Errorf("%s mode = %v, want %v", w.path, fi.Mode(), w.mode)
		}
	}
	for _, d := range []string{"etc", "etc/kiln", "etc/systemd/system", "usr/local/bin", "var/lib/kiln"} {
		fi, err := os.Stat(filepath.Join(root, d))
		if err != nil || fi.Mode() != fs.ModeDir|0o755 {
			t.Errorf("directory /%s: %v, %v; want drwxr-xr-x", d, fi.Mode(), err)
		}
	}
	leftovers, _ := filepath.Glob(filepath.Join(root, "etc", ".kiln-*"))
	if len(leftovers) > 0 {
		t.Errorf("temporary files left behind: %v", leftovers)
	}
}

// checkGoodBootStatus checks the status.json TestRunAppliesFiles left: every key, no error, the
// source, clock and version, and each file's hash and mode.
func checkGoodBootStatus(t *testing.T, root string, unit []byte) {
	t.Helper()
	raw, stored := readStatusFile(t, root)
	for _, key := range []string{"state", "started", "finished", "duration_ms", "source", "files", "version"} {
		if _, ok := raw[key]; !ok {
			t.Errorf("status.json has no %q: %v", key, raw)
		}
	}
	if _, ok := raw["error"]; ok {
		t.Errorf("status.json of a good boot has an error: %v", raw["error"])
	}
	if stored.State != "ok" || stored.Source != "fw_cfg" || stored.DurationMS != 1500 || stored.Version != "v0.1.0-test" ||
		!stored.Started.Equal(t0) || !stored.Finished.Equal(t0.Add(1500*time.Millisecond)) {
		t.Errorf("status = %+v", stored)
	}
	wantStatus := []FileStatus{
		{"/etc/hostname", sha256hex([]byte("node-1\n")), "0644"},
		{"/etc/kiln/secret", sha256hex([]byte("s3cr3t")), "0600"},
		{"/etc/systemd/system/demo.service", sha256hex(unit), "0644"},
		{"/usr/local/bin/tool", sha256hex([]byte("#!/bin/sh\n")), "0755"},
		{"/etc/kiln/empty", sha256hex(nil), "0644"},
	}
	if fmt.Sprint(stored.Files) != fmt.Sprint(wantStatus) {
		t.Errorf("status files = %v\nwant %v", stored.Files, wantStatus)
	}
}

func TestRunNoConfig(t *testing.T) {
	root := t.TempDir()
	st, err := Run(context.Background(), Options{
		Root:      root,
		Providers: []source.Provider{noFWCfg(t), source.Embedded{Path: filepath.Join(root, "usr/lib/kiln/config.ign")}},
		Now:       clock(20 * time.Millisecond),
	})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if got, want := st.Line(), "kiln-init: firstboot ok source=none files=0 tasks=19 applied=1 unchanged=18 failed=0 duration=20ms"; got != want {
		t.Errorf("Line = %q, want %q", got, want)
	}
	if _, stored := readStatusFile(t, root); stored.State != "ok" || stored.Source != "none" || stored.Files == nil {
		t.Errorf("status = %+v", stored)
	}
}

func TestRunEmbeddedConfig(t *testing.T) {
	root := t.TempDir()
	embedded := filepath.Join(t.TempDir(), "config.ign")
	if err := os.WriteFile(embedded, []byte(ignition(`{"path":"/etc/motd","contents":{"source":"data:,baked"}}`)), 0o644); err != nil {
		t.Fatal(err)
	}
	st, err := Run(context.Background(), Options{Root: root, Providers: []source.Provider{noFWCfg(t), source.Embedded{Path: embedded}}})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if st.Source != "embedded" || len(st.Files) != 1 {
		t.Errorf("status = %+v", st)
	}
	if data, _ := os.ReadFile(filepath.Join(root, "etc/motd")); string(data) != "baked" {
		t.Errorf("/etc/motd = %q", data)
	}
}

func TestRunFailures(t *testing.T) {
	goodHash := sha256hex([]byte("expected"))
	tests := []struct {
		name      string
		existing  map[string]string // files present before the run
		config    string
		wantErr   string
		untouched map[string]string // files that must still hold these contents
		absent    []string          // files that must not exist afterwards
	}{
		{
			name:      "existing file without overwrite",
			existing:  map[string]string{"etc/hostname": "old\n"},
			config:    ignition(`{"path":"/etc/hostname","contents":{"source":"data:,new"}}`),
			wantErr:   "storage.files[0] (/etc/hostname): already exists (a regular file) with other contents and overwrite is false",
			untouched: map[string]string{"etc/hostname": "old\n"},
		},
		{
			name: "hash mismatch writes nothing",
			config: ignition(
				`{"path":"/etc/first","contents":{"source":"data:,fine"}}`,
				`{"path":"/etc/second","contents":{"source":"data:,tampered","verification":{"hash":"sha256-`+goodHash+`"}}}`),
			wantErr: "storage.files[1].contents.verification.hash: sha256 mismatch",
			absent:  []string{"etc/first", "etc/second"},
		},
		{
			name:    "unsupported section",
			config:  `{"ignition":{"version":"3.4.0"},"storage":{"luks":[{"name":"x","device":"/dev/vdb","clevis":{"tpm2":true}}],"files":[{"path":"/etc/a","contents":{"source":"data:,a"}}]}}`,
			wantErr: "config from fw_cfg: storage.luks[0].clevis: clevis (tang, tpm2) is not supported: give a keyFile",
			absent:  []string{"etc/a"},
		},
		{
			name:    "garbage config",
			config:  "#cloud-config\nhostname: x\n",
			wantErr: "config from fw_cfg: parse config",
		},
		{
			name:     "directory in the way",
			existing: map[string]string{"etc/hostname/keep": "x"},
			config:   ignition(`{"path":"/etc/hostname","overwrite":true,"contents":{"source":"data:,new"}}`),
			wantErr:  "is a directory",
		},
		{
			name:     "file in the way of a directory",
			existing: map[string]string{"etc/kiln": "not a dir"},
			config:   ignition(`{"path":"/etc/kiln/node.yaml","contents":{"source":"data:,x"}}`),
			wantErr:  "storage.files[0] (/etc/kiln/node.yaml): stat: statat etc/kiln/node.yaml: not a directory",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			for p, c := range tc.existing {
				mustWrite(t, filepath.Join(root, p), c)
			}
			st, err := Run(context.Background(), Options{Root: root, Providers: []source.Provider{fwcfg(t, tc.config)}})
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("Run error = %v, want %q", err, tc.wantErr)
			}
			line := st.Line()
			if !strings.HasPrefix(line, "kiln-init: firstboot failed: ") || !strings.Contains(line, tc.wantErr) || strings.Contains(line, "\n") {
				t.Errorf("Line = %q, want one line with the reason %q", line, tc.wantErr)
			}
			_, stored := readStatusFile(t, root)
			if stored.State != "failed" || !strings.Contains(stored.Error, tc.wantErr) {
				t.Errorf("stored status = %+v", stored)
			}
			for p, c := range tc.untouched {
				if data, _ := os.ReadFile(filepath.Join(root, p)); string(data) != c {
					t.Errorf("%s = %q, want it untouched (%q)", p, data, c)
				}
			}
			for _, p := range tc.absent {
				if _, err := os.Lstat(filepath.Join(root, p)); !errors.Is(err, fs.ErrNotExist) {
					t.Errorf("%s exists after a failed run", p)
				}
			}
		})
	}
}

func mustWrite(t *testing.T, p, contents string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(contents), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestRunOverwrite(t *testing.T) {
	root := t.TempDir()
	outside := filepath.Join(t.TempDir(), "victim")
	mustWrite(t, outside, "outside")
	mustWrite(t, filepath.Join(root, "etc/hostname"), "old\n")
	if err := os.Symlink(outside, filepath.Join(root, "etc/resolv.conf")); err != nil {
		t.Fatal(err)
	}
	mustWrite(t, filepath.Join(root, "etc/keep"), "kept")
	if err := os.Chmod(filepath.Join(root, "etc/keep"), 0o600); err != nil {
		t.Fatal(err)
	}

	_, err := Run(context.Background(), Options{Root: root, Providers: []source.Provider{fwcfg(t, ignition(
		`{"path":"/etc/hostname","overwrite":true,"contents":{"source":"data:,new%0A"}}`,
		`{"path":"/etc/resolv.conf","overwrite":true,"mode":420,"contents":{"source":"data:,nameserver%2010.0.0.1%0A"}}`,
		`{"path":"/etc/keep","mode":416}`,
	))}})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if data, _ := os.ReadFile(filepath.Join(root, "etc/hostname")); string(data) != "new\n" {
		t.Errorf("/etc/hostname = %q", data)
	}
	fi, err := os.Lstat(filepath.Join(root, "etc/resolv.conf"))
	if err != nil || !fi.Mode().IsRegular() {
		t.Errorf("/etc/resolv.conf should be a regular file replacing the symlink: %v %v", fi.Mode(), err)
	}
	if data, _ := os.ReadFile(outside); string(data) != "outside" {
		t.Errorf("the symlink's target outside the root was written: %q", data)
	}
	// No contents: existing file kept, mode applied.
	fi, _ = os.Stat(filepath.Join(root, "etc/keep"))
	if data, _ := os.ReadFile(filepath.Join(root, "etc/keep")); string(data) != "kept" || fi.Mode() != 0o640 {
		t.Errorf("/etc/keep = %q %v, want contents kept and mode 0640", data, fi.Mode())
	}
}

func TestRunStaysInsideRoot(t *testing.T) {
	root := t.TempDir()
	outside := t.TempDir()
	// An absolute symlink and a relative one that climbs above the root, as a hostile or
	// careless image might carry.
	if err := os.Symlink(outside, filepath.Join(root, "etc")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../../../../../../.."+outside, filepath.Join(root, "opt")); err != nil {
		t.Fatal(err)
	}
	_, err := Run(context.Background(), Options{Root: root, Providers: []source.Provider{fwcfg(t, ignition(
		`{"path":"/etc/a","contents":{"source":"data:,a"}}`,
		`{"path":"/opt/b","contents":{"source":"data:,b"}}`,
	))}})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	entries, _ := os.ReadDir(outside)
	if len(entries) != 0 {
		t.Errorf("files written outside the root: %v", entries)
	}
	// Both links resolve as if root were "/": to <root><outside>.
	for _, name := range []string{"a", "b"} {
		if _, err := os.Stat(filepath.Join(root, outside, name)); err != nil {
			t.Errorf("%s not written inside the root: %v", name, err)
		}
	}
}

func TestRunSecondBootSkips(t *testing.T) {
	root := t.TempDir()
	cfg := ignition(`{"path":"/etc/hostname","contents":{"source":"data:,node-1"}}`)
	first, err := Run(context.Background(), Options{Root: root, Providers: []source.Provider{fwcfg(t, cfg)}, Now: clock(time.Second)})
	if err != nil {
		t.Fatalf("first Run: %v", err)
	}
	// Age the files so that any rewrite shows.
	old := time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)
	paths := []string{"etc/hostname", "var/lib/kiln/status.json"}
	for _, p := range paths {
		if err := os.Chtimes(filepath.Join(root, p), old, old); err != nil {
			t.Fatal(err)
		}
	}
	statusBefore, _ := os.ReadFile(filepath.Join(root, "var/lib/kiln/status.json"))

	// Even with a different config on offer, nothing changes.
	second, err := Run(context.Background(), Options{Root: root, Providers: []source.Provider{fwcfg(t, ignition(`{"path":"/etc/other","contents":{"source":"data:,x"}}`))}})
	if err != nil {
		t.Fatalf("second Run: %v", err)
	}
	if !second.Skipped || second.State != "ok" {
		t.Errorf("second status = %+v, want skipped ok", second)
	}
	if got, want := second.Line(), "kiln-init: firstboot done already ("+first.Finished.Format(time.RFC3339)+")"; got != want {
		t.Errorf("Line = %q, want %q", got, want)
	}
	if !second.Finished.Equal(first.Finished) {
		t.Errorf("finished = %v, want the first run's %v", second.Finished, first.Finished)
	}
	for _, p := range paths {
		fi, err := os.Stat(filepath.Join(root, p))
		if err != nil || !fi.ModTime().Equal(old) {
			t.Errorf("%s modified by the second run (mtime %v, %v)", p, fi.ModTime(), err)
		}
	}
	if after, _ := os.ReadFile(filepath.Join(root, "var/lib/kiln/status.json")); !bytes.Equal(after, statusBefore) {
		t.Error("status.json changed")
	}
	if _, err := os.Stat(filepath.Join(root, "etc/other")); err == nil {
		t.Error("second run applied a config")
	}
}

func TestRunRetriesAfterFailure(t *testing.T) {
	root := t.TempDir()
	if _, err := Run(context.Background(), Options{Root: root, Providers: []source.Provider{fwcfg(t, "garbage")}}); err == nil {
		t.Fatal("first Run accepted garbage")
	}
	st, err := Run(context.Background(), Options{Root: root, Providers: []source.Provider{fwcfg(t, ignition(`{"path":"/etc/a","contents":{"source":"data:,a"}}`))}})
	if err != nil || st.Skipped || st.State != "ok" {
		t.Fatalf("retry = %+v, %v; want a fresh ok run", st, err)
	}
	if _, stored := readStatusFile(t, root); stored.State != "ok" || stored.Error != "" {
		t.Errorf("stored status after retry = %+v", stored)
	}
}

func TestRunConvergesAfterPartialFailure(t *testing.T) {
	root := t.TempDir()
	mustWrite(t, filepath.Join(root, "etc/second"), "someone else's")
	cfg := ignition(
		`{"path":"/etc/first","mode":384,"contents":{"source":"data:,one"}}`,
		`{"path":"/etc/second","contents":{"source":"data:,two"}}`)
	if _, err := Run(context.Background(), Options{Root: root, Providers: []source.Provider{fwcfg(t, cfg)}}); err == nil {
		t.Fatal("first Run overwrote /etc/second")
	}
	// The operator removes the conflicting file and reboots: the retry finds /etc/first
	// as it left it and goes on.
	if err := os.Remove(filepath.Join(root, "etc/second")); err != nil {
		t.Fatal(err)
	}
	st, err := Run(context.Background(), Options{Root: root, Providers: []source.Provider{fwcfg(t, cfg)}})
	if err != nil {
		t.Fatalf("retry: %v", err)
	}
	if len(st.Files) != 2 || st.Files[0].Mode != "0600" {
		t.Errorf("files = %+v", st.Files)
	}
}

func TestLine(t *testing.T) {
	tests := []struct {
		st   Status
		want string
	}{
		{Status{State: "ok", Source: "fw_cfg", Files: make([]FileStatus, 3), DurationMS: 42,
			Tasks: []task.TaskStatus{{Name: "files", State: task.StateApplied}, {Name: "units", State: task.StateUnchanged}}},
			"kiln-init: firstboot ok source=fw_cfg files=3 tasks=2 applied=1 unchanged=1 failed=0 duration=42ms"},
		{Status{State: "ok", Source: "none", DurationMS: 0}, "kiln-init: firstboot ok source=none files=0 tasks=0 applied=0 unchanged=0 failed=0 duration=0s"},
		{Status{State: "failed", Error: "config from fw_cfg: passwd.users is not supported by kiln yet\nstorage.disks is not supported by kiln yet"},
			"kiln-init: firstboot failed: config from fw_cfg: passwd.users is not supported by kiln yet; storage.disks is not supported by kiln yet"},
		{Status{State: "ok", Skipped: true, Finished: time.Date(2026, 3, 1, 12, 0, 1, 500, time.UTC)}, "kiln-init: firstboot done already (2026-03-01T12:00:01Z)"},
	}
	for _, tc := range tests {
		if got := tc.st.Line(); got != tc.want {
			t.Errorf("Line = %q, want %q", got, tc.want)
		}
	}
}

func TestPrintStatus(t *testing.T) {
	st := &Status{State: "ok", Started: t0, Finished: t0.Add(35 * time.Millisecond), DurationMS: 35, Source: "fw_cfg", Version: "v0.1.0",
		Hostname: "ip-10-0-1-5", HostnameSource: "platform", InstanceID: "i-0123", Zone: "eu-west-1b",
		Files: []FileStatus{{Path: "/etc/hostname", SHA256: sha256hex([]byte("x")), Mode: "0644"}}}
	tests := []struct {
		format  string
		want    []string
		wantErr bool
	}{
		{format: "table", want: []string{"STATE     ok", "SOURCE    fw_cfg", "STARTED   2026-03-01T12:00:00Z", "DURATION  35ms", "VERSION   v0.1.0", "FILES     1",
			"HOSTNAME  ip-10-0-1-5 (from platform)", "INSTANCE  i-0123 in eu-west-1b",
			"PATH           MODE  SHA256", "/etc/hostname  0644  " + sha256hex([]byte("x"))}},
		{format: "json", want: []string{`"state": "ok"`, `"hostnameSource": "platform"`, `"duration_ms": 35`, `"sha256": "` + sha256hex([]byte("x"))}},
		{format: "yaml", wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.format, func(t *testing.T) {
			var b bytes.Buffer
			err := PrintStatus(&b, st, tc.format)
			if tc.wantErr {
				if err == nil {
					t.Fatal("unknown format accepted")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range tc.want {
				if !strings.Contains(b.String(), w) {
					t.Errorf("output lacks %q:\n%s", w, b.String())
				}
			}
			if tc.format == "json" {
				var back Status
				if err := json.Unmarshal(b.Bytes(), &back); err != nil || back.Files[0] != st.Files[0] {
					t.Errorf("json output does not round-trip: %v", err)
				}
			}
		})
	}
}

func TestReadStatus(t *testing.T) {
	root := t.TempDir()
	if _, err := ReadStatus(root); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("ReadStatus on a fresh node = %v, want ErrNotExist", err)
	}
	if _, err := Run(context.Background(), Options{Root: root, Providers: []source.Provider{noFWCfg(t)}}); err != nil {
		t.Fatal(err)
	}
	st, err := ReadStatus(root)
	if err != nil || st.State != "ok" {
		t.Errorf("ReadStatus = %+v, %v", st, err)
	}
}
