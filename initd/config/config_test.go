package config

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"testing"

	"github.com/vincent-petithory/dataurl"
)

func gz(t testing.TB, data []byte) []byte {
	t.Helper()
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	if _, err := zw.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

const filesCfg = `{"ignition":{"version":"3.4.0"},"storage":{"files":[
 {"path":"/etc/hostname","mode":420,"contents":{"source":"data:,node-1%0A"}},
 {"path":"/etc/kiln/node.yaml","overwrite":true,"contents":{"source":"data:text/plain;base64,cm9sZTogd29ya2VyCg=="}}]}}`

func TestParse(t *testing.T) {
	tests := []struct {
		name      string
		raw       []byte
		wantErr   string // substring; "" means success
		wantFiles int
	}{
		{name: "spec 3.0", raw: []byte(`{"ignition":{"version":"3.0.0"}}`)},
		{name: "spec 3.3", raw: []byte(`{"ignition":{"version":"3.3.0"}}`)},
		{name: "spec 3.5 with files", raw: []byte(strings.Replace(filesCfg, "3.4.0", "3.5.0", 1)), wantFiles: 2},
		{name: "spec 3.4 with files", raw: []byte(filesCfg), wantFiles: 2},
		{name: "gzip'd", raw: gz(t, []byte(filesCfg)), wantFiles: 2},
		{name: "empty", raw: nil, wantErr: "config is empty"},
		{name: "blank", raw: []byte(" \n"), wantErr: "config is empty"},
		{name: "not JSON", raw: []byte("#cloud-config\nusers: []\n"), wantErr: "parse config"},
		{name: "truncated JSON", raw: []byte(`{"ignition":{"version":"3.4.0"}`), wantErr: "parse config"},
		{name: "spec 2.x", raw: []byte(`{"ignition":{"version":"2.2.0"}}`), wantErr: "unsupported config version"},
		{name: "experimental spec", raw: []byte(`{"ignition":{"version":"3.6.0-experimental"}}`), wantErr: "unsupported config version"},
		{name: "no version", raw: []byte(`{"storage":{}}`), wantErr: "parse config"},
		{name: "relative file path", raw: []byte(`{"ignition":{"version":"3.4.0"},"storage":{"files":[{"path":"etc/x"}]}}`),
			wantErr: "storage.files[0].path: path not absolute"},
		{name: "bad mode", raw: []byte(`{"ignition":{"version":"3.4.0"},"storage":{"files":[{"path":"/x","mode":99999}]}}`),
			wantErr: "storage.files[0].mode"},
		{name: "wrong type", raw: []byte(`{"ignition":{"version":"3.4.0"},"storage":{"files":{"path":"/x"}}}`),
			wantErr: "parse config"},
		{name: "path not simplified", raw: []byte(`{"ignition":{"version":"3.4.0"},"storage":{"files":[{"path":"/etc/../x"}]}}`),
			wantErr: "storage.files[0].path: path is not fully simplified"},
		{name: "bad data URL", raw: []byte(`{"ignition":{"version":"3.4.0"},"storage":{"files":[{"path":"/x","contents":{"source":"data:;base64,!!!"}}]}}`),
			wantErr: "storage.files[0].contents.source"},
		{name: "broken gzip", raw: []byte{0x1f, 0x8b, 0x08, 0, 1, 2, 3}, wantErr: "gzip'd config"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := Parse(tc.raw)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Parse error = %v, want it to contain %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if got := len(cfg.Ignition.Storage.Files); got != tc.wantFiles {
				t.Errorf("files = %d, want %d", got, tc.wantFiles)
			}
			if err := cfg.Validate(); err != nil {
				t.Errorf("Validate: %v", err)
			}
		})
	}
}

func TestParseWarnings(t *testing.T) {
	cfg, err := Parse([]byte(`{"ignition":{"version":"3.4.0"},"storage":{"files":[{"path":"/usr/local/bin/x","mode":2541}]}}`))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	if len(cfg.Warnings) == 0 || !strings.HasPrefix(cfg.Warnings[0], "storage.files[0].mode") {
		t.Errorf("Warnings = %q, want one about storage.files[0].mode", cfg.Warnings)
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name string
		body string // JSON after "ignition" version
		want []string
	}{
		{name: "files only", body: `"storage":{"files":[{"path":"/etc/a","user":{"id":0},"group":{"name":"root"},"contents":{"source":"data:,a","compression":"","verification":{"hash":"sha256-ca978112ca1bbdcafac231b39a23dc4da786eff8147c4e72b9807785afee48bb"}}}]}`},
		{name: "empty sections", body: `"passwd":{"users":[]},"systemd":{"units":[]},"storage":{"disks":[]}`},
		{name: "file without contents", body: `"storage":{"files":[{"path":"/etc/a"}]}`},
		{name: "users", body: `"passwd":{"users":[{"name":"core"}]}`,
			want: []string{"passwd.users is not supported by kiln yet"}},
		{name: "groups", body: `"passwd":{"groups":[{"name":"ops"}]}`,
			want: []string{"passwd.groups is not supported by kiln yet"}},
		{name: "disks", body: `"storage":{"disks":[{"device":"/dev/vdb"}]}`,
			want: []string{"storage.disks is not supported by kiln yet"}},
		{name: "filesystems, directories, links", body: `"storage":{"filesystems":[{"device":"/dev/vdb","format":"ext4"}],"directories":[{"path":"/srv"}],"links":[{"path":"/a","target":"/b"}]}`,
			want: []string{"storage.filesystems is not", "storage.directories is not", "storage.links is not"}},
		{name: "units", body: `"systemd":{"units":[{"name":"a.service","enabled":true}]}`,
			want: []string{"systemd.units is not supported by kiln yet"}},
		{name: "kernel arguments", body: `"kernelArguments":{"shouldExist":["quiet"]}`,
			want: []string{"kernelArguments.shouldExist is not supported by kiln yet"}},
		{name: "append", body: `"storage":{"files":[{"path":"/etc/a"},{"path":"/etc/b","append":[{"source":"data:,x"}]}]}`,
			want: []string{"storage.files[1].append is not supported by kiln yet"}},
		{name: "remote source", body: `"storage":{"files":[{"path":"/etc/a","contents":{"source":"https://example.com/a"}}]}`,
			want: []string{`storage.files[0].contents.source: scheme "https" is not supported by kiln yet`}},
		{name: "http headers", body: `"storage":{"files":[{"path":"/etc/a","contents":{"source":"https://example.com/a","httpHeaders":[{"name":"X","value":"y"}]}}]}`,
			want: []string{"storage.files[0].contents.httpHeaders is not supported", `scheme "https"`}},
		{name: "non-root owner", body: `"storage":{"files":[{"path":"/etc/a","user":{"name":"core"},"group":{"id":1000}}]}`,
			want: []string{"storage.files[0].user: owners other than root", "storage.files[0].group: groups other than root"}},
		{name: "several at once", body: `"passwd":{"users":[{"name":"core"}]},"storage":{"disks":[{"device":"/dev/vdb"}]}`,
			want: []string{"passwd.users", "storage.disks"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := Parse([]byte(`{"ignition":{"version":"3.4.0"},` + tc.body + `}`))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			err = cfg.Validate()
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate accepted the config, want errors %q", tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Validate error %q does not contain %q", err, w)
				}
			}
			var fe *FieldError
			if !errors.As(err, &fe) || !errors.Is(err, ErrUnsupported) {
				t.Errorf("Validate error %v is not a *FieldError wrapping ErrUnsupported", err)
			}
		})
	}
}

func TestValidateIgnitionSection(t *testing.T) {
	tests := []struct{ name, ignition, want string }{
		{"merge", `"config":{"merge":[{"source":"data:,%7B%7D"}]}`, "ignition.config.merge is not supported by kiln yet"},
		{"timeouts", `"timeouts":{"httpTotal":10}`, "ignition.timeouts.httpTotal is not supported by kiln yet"},
		{"proxy", `"proxy":{"httpProxy":"http://proxy:3128"}`, "ignition.proxy.httpProxy is not supported by kiln yet"},
		{"tls", `"security":{"tls":{"certificateAuthorities":[{"source":"data:,x"}]}}`, "ignition.security.tls.certificateAuthorities is not supported by kiln yet"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := Parse([]byte(`{"ignition":{"version":"3.4.0",` + tc.ignition + `}}`))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if err := cfg.Validate(); err == nil || err.Error() != tc.want {
				t.Errorf("Validate = %v, want %q", err, tc.want)
			}
		})
	}
}

func TestFiles(t *testing.T) {
	unit := []byte("[Service]\nExecStart=/bin/true\n")
	s256 := sha256.Sum256(unit)
	s512 := sha512.Sum512(unit)
	gzURL := dataurl.EncodeBytes(gz(t, unit))

	type want struct {
		path        string
		mode        fs.FileMode
		modeSet     bool
		overwrite   bool
		hasContents bool
		contents    string
	}
	tests := []struct {
		name    string
		file    string
		want    want
		wantErr string
	}{
		{name: "percent-encoded data URL", file: `{"path":"/etc/hostname","contents":{"source":"data:,node-1%0A"}}`,
			want: want{path: "/etc/hostname", hasContents: true, contents: "node-1\n"}},
		{name: "base64 with mode and overwrite", file: `{"path":"/etc/ssh/key","mode":384,"overwrite":true,"contents":{"source":"data:;base64,c2VjcmV0"}}`,
			want: want{path: "/etc/ssh/key", mode: 0o600, modeSet: true, overwrite: true, hasContents: true, contents: "secret"}},
		{name: "gzip with sha512 of the decompressed bytes", file: fmt.Sprintf(`{"path":"/etc/systemd/system/a.service","contents":{"source":%q,"compression":"gzip","verification":{"hash":"sha512-%s"}}}`, gzURL, hex.EncodeToString(s512[:])),
			want: want{path: "/etc/systemd/system/a.service", hasContents: true, contents: string(unit)}},
		{name: "sha256", file: fmt.Sprintf(`{"path":"/a","contents":{"source":%q,"verification":{"hash":"sha256-%s"}}}`, dataurl.EncodeBytes(unit), hex.EncodeToString(s256[:])),
			want: want{path: "/a", hasContents: true, contents: string(unit)}},
		{name: "setuid mode", file: `{"path":"/usr/local/bin/x","mode":2541,"contents":{"source":"data:,x"}}`,
			want: want{path: "/usr/local/bin/x", mode: 0o755 | fs.ModeSetuid, modeSet: true, hasContents: true, contents: "x"}},
		{name: "no contents", file: `{"path":"/etc/empty"}`, want: want{path: "/etc/empty"}},
		{name: "hash mismatch", file: fmt.Sprintf(`{"path":"/a","contents":{"source":"data:,tampered","verification":{"hash":"sha256-%s"}}}`, hex.EncodeToString(s256[:])),
			wantErr: "storage.files[0].contents.verification.hash: sha256 mismatch"},
		{name: "gzip flag on plain data", file: `{"path":"/a","contents":{"source":"data:,plain","compression":"gzip"}}`,
			wantErr: "storage.files[0].contents: gunzip"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := Parse([]byte(`{"ignition":{"version":"3.4.0"},"storage":{"files":[` + tc.file + `]}}`))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if err := cfg.Validate(); err != nil {
				t.Fatalf("Validate: %v", err)
			}
			files, err := cfg.Files()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Files error = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Files: %v", err)
			}
			if len(files) != 1 {
				t.Fatalf("got %d files, want 1", len(files))
			}
			f := files[0]
			got := want{path: f.Path, mode: f.Mode, modeSet: f.ModeSet, overwrite: f.Overwrite, hasContents: f.HasContents, contents: string(f.Contents)}
			if got != tc.want {
				t.Errorf("file = %+v\nwant   %+v", got, tc.want)
			}
			if f.Field != "storage.files[0]" {
				t.Errorf("Field = %q", f.Field)
			}
		})
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(filesCfg))
	f.Add(gz(f, []byte(filesCfg)))
	f.Add([]byte(`{"ignition":{"version":"3.0.0"},"passwd":{"users":[{"name":"core","sshAuthorizedKeys":["ssh-ed25519 AAAA"]}]}}`))
	f.Add([]byte(`{"ignition":{"version":"3.5.0"},"storage":{"files":[{"path":"/a","mode":493,"contents":{"source":"data:,x","compression":"gzip","verification":{"hash":"sha512-00"}}}]}}`))
	f.Add([]byte(`{"ignition":{"version":"3.2.0","config":{"merge":[{"source":"data:,%7B%7D"}]}},"systemd":{"units":[{"name":"a.service"}]}}`))
	f.Add([]byte(`{}`))
	f.Add([]byte{0x1f, 0x8b})
	f.Fuzz(func(t *testing.T, raw []byte) {
		cfg, err := Parse(raw)
		if err != nil {
			if cfg != nil {
				t.Fatal("Parse returned a config with an error")
			}
			return
		}
		if cfg.Validate() != nil {
			return
		}
		files, err := cfg.Files()
		if err != nil {
			return
		}
		for _, f := range files {
			if !strings.HasPrefix(f.Path, "/") || strings.Contains(f.Path, "/../") || strings.HasSuffix(f.Path, "/..") {
				t.Fatalf("resolved path %q is not clean and absolute", f.Path)
			}
			if f.Mode&^(fs.ModePerm|fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky) != 0 {
				t.Fatalf("mode %v has bits beyond permissions", f.Mode)
			}
		}
	})
}
