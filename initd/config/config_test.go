package config

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kilnproject/kiln/internal/testkit"
	"github.com/vincent-petithory/dataurl"
)

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
		{name: "gzip'd", raw: testkit.Gzip(t, []byte(filesCfg)), wantFiles: 2},
		{name: "empty", raw: nil, wantErr: "config is empty"},
		{name: "blank", raw: []byte(" \n"), wantErr: "config is empty"},
		{name: "truncated JSON", raw: []byte(`{"ignition":{"version":"3.4.0"}`), wantErr: "parse config"},
		{name: "experimental spec", raw: []byte(`{"ignition":{"version":"3.6.0-experimental"}}`), wantErr: "ignition.version 3.6.0-experimental is not supported (3.0.0 to 3.6.0)"},
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
		{name: "unknown key is an error", raw: []byte(`{"ignition":{"version":"3.4.0"},"storage":{"filez":[]}}`),
			wantErr: "storage.filez: unused key filez (line 1 col 44)"},
		{name: "owner by id and name", raw: []byte(`{"ignition":{"version":"3.5.0"},"storage":{"files":[{"path":"/etc/a","user":{"id":1,"name":"core"}}]}}`),
			wantErr: "storage.files[0].user: cannot set both id and name"},
		{name: "link without target", raw: []byte(`{"ignition":{"version":"3.5.0"},"storage":{"links":[{"path":"/a"}]}}`),
			wantErr: "storage.links[0].target: link target is required"},
		{name: "cloud-config", raw: []byte("#cloud-config\nusers: []\n"), wantErr: "cloud-config user data is not supported: kiln takes Ignition JSON"},
		{name: "Butane", raw: []byte("variant: fcos\nversion: 1.6.0\nstorage:\n  files:\n    - path: /etc/a\n      contents: {inline: x}\n    - path: /etc/b\n"), wantFiles: 2},
		{name: "Butane 1.0.0", raw: []byte("variant: fcos\nversion: 1.0.0\nstorage:\n  files:\n    - path: /etc/a\n"), wantFiles: 1},
		{name: "gzip'd Butane", raw: testkit.Gzip(t, []byte("variant: fcos\nversion: 1.5.0\nstorage:\n  files:\n    - path: /etc/a\n")), wantFiles: 1},
		{name: "Butane unknown key", raw: []byte("variant: fcos\nversion: 1.6.0\nstorage:\n  filez: []\n"), wantErr: "butane: storage.filez: unused key filez (line 4 col 3)"},
		{name: "Butane decimal mode", raw: []byte("variant: fcos\nversion: 1.6.0\nstorage:\n  files:\n    - path: /etc/a\n      mode: 644\n"),
			wantErr: "storage.files[0].mode: unreasonable mode would be reasonable if specified in octal; remember to add a leading zero (line 6 col 13)"},
		{name: "Butane bad path", raw: []byte("variant: fcos\nversion: 1.6.0\nstorage:\n  files:\n    - path: etc/a\n"), wantErr: "storage.files[0].path: path not absolute (line 5 col 13)"},
		{name: "Butane local file", raw: []byte("variant: fcos\nversion: 1.6.0\nstorage:\n  files:\n    - path: /etc/a\n      contents: {local: a.txt}\n"), wantErr: "storage.files[0].contents.local"},
		{name: "Butane YAML syntax", raw: []byte("variant: fcos\nversion: 1.6.0\nstorage: [\n"), wantErr: "line 3"},
		{name: "Butane other variant", raw: []byte("variant: openshift\nversion: 4.19.0\n"), wantErr: `variant "openshift" is not supported; kiln takes`},
		{name: "Butane too new", raw: []byte("variant: fcos\nversion: 1.8.0-experimental\n"), wantErr: "butane: version 1.8.0-experimental of variant fcos is not supported (1.0.0 to 1.7.0); kiln takes Ignition JSON (spec 3.0.0 to 3.6.0) or Butane YAML (variant: fcos with version: 1.0.0 to 1.7.0, or variant: flatcar with version: 1.0.0 to 1.1.0)"},
		{name: "Butane fcos 1.7", raw: []byte("variant: fcos\nversion: 1.7.0\nstorage:\n  files:\n    - path: /etc/a\n      contents: {inline: x}\n"), wantFiles: 1},
		{name: "Butane fcos 1.0", raw: []byte("variant: fcos\nversion: 1.0.0\nstorage:\n  files:\n    - path: /etc/a\n      contents: {inline: x}\n"), wantFiles: 1},
		{name: "Butane flatcar 1.1", raw: []byte("variant: flatcar\nversion: 1.1.0\nstorage:\n  files:\n    - path: /etc/a\n      contents: {inline: x}\n"), wantFiles: 1},
		{name: "Butane flatcar too new", raw: []byte("variant: flatcar\nversion: 1.2.0\n"), wantErr: "butane: version 1.2.0 of variant flatcar is not supported (1.0.0 to 1.1.0)"},
		{name: "Butane other variant", raw: []byte("variant: openshift\nversion: 4.14.0\n"), wantErr: `butane: variant "openshift" is not supported; kiln takes`},
		{name: "spec 3.6", raw: []byte(strings.Replace(filesCfg, "3.4.0", "3.6.0", 1)), wantFiles: 2},
		{name: "spec 3.7 experimental", raw: []byte(`{"ignition":{"version":"3.7.0-experimental"}}`), wantErr: "parse config: ignition.version 3.7.0-experimental is not supported (3.0.0 to 3.6.0); kiln takes"},
		{name: "spec 2.2", raw: []byte(`{"ignition":{"version":"2.2.0"}}`), wantErr: "parse config: ignition.version 2.2.0 is not supported (3.0.0 to 3.6.0)"},
		{name: "spec not a version", raw: []byte(`{"ignition":{"version":"three"}}`), wantErr: `parse config: ignition.version "three" is not a version like 3.6.0`},
		{name: "Butane no variant", raw: []byte("version: 1.6.0\n"), wantErr: "butane: variant is not set"},
		{name: "YAML list", raw: []byte("- a\n- b\n"), wantErr: "neither Ignition JSON nor Butane YAML"},
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

// Test SSH keys: public halves of throwaway keys.
const (
	edKey = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIO3StSM+Z0fcvKzvDFRc5J42hHUIvqb34l+kqVYzwQ6k alice@example"
	ecKey = "ecdsa-sha2-nistp256 AAAAE2VjZHNhLXNoYTItbmlzdHAyNTYAAAAIbmlzdHAyNTYAAABBBNbQSXFgTLGAliugoFbysXTmQuJYlzR75/jc8zg0QlZppZMF5Ck8OOuC7FwCum//7NX9caQk0gx1Dg09apc5+9g="
	hashA = "sha256-ca978112ca1bbdcafac231b39a23dc4da786eff8147c4e72b9807785afee48bb"
)

// validateCase is an Ignition config body and what Validate says of it.
type validateCase struct {
	name            string
	body            string // JSON after "ignition" version
	want            []string
	wantUnsupported bool // errors.Is(err, errUnsupported)
}

var validateCases = []validateCase{
	{name: "files only", body: `"storage":{"files":[{"path":"/etc/a","user":{"id":0},"group":{"name":"root"},"contents":{"source":"data:,a","compression":"","verification":{"hash":"` + hashA + `"}}}]}`},
	{name: "empty sections", body: `"passwd":{"users":[]},"systemd":{"units":[]},"storage":{"disks":[]}`},
	{name: "file without contents", body: `"storage":{"files":[{"path":"/etc/a"}]}`},
	{name: "everything kiln applies", body: `"storage":{
		"files":[{"path":"/etc/a","mode":384,"overwrite":true,"user":{"name":"core"},"group":{"id":1000},"contents":{"source":"https://example.com/a.gz","compression":"gzip","verification":{"hash":"` + hashA + `"}}}],
		"directories":[{"path":"/srv/data","mode":448,"overwrite":false,"user":{"id":1000},"group":{"name":"ops"}}],
		"links":[{"path":"/usr/local/bin/k","target":"kubectl","overwrite":true,"user":{"name":"core"}},{"path":"/etc/b","target":"/etc/a","hard":true}]},
		"systemd":{"units":[{"name":"a.service","enabled":true,"contents":"[Service]\nExecStart=/bin/true\n[Install]\nWantedBy=multi-user.target\n","dropins":[{"name":"10-x.conf","contents":"[Service]\nEnvironment=X=1\n"}]},
			{"name":"b.service","enabled":false},{"name":"c.service","mask":true}]},
		"passwd":{"users":[{"name":"core","uid":1000,"gecos":"Core","homeDir":"/home/core","shell":"/bin/bash","primaryGroup":"core","groups":["sudo","ops"],
			"passwordHash":"$y$j9T$abc$def","sshAuthorizedKeys":["` + edKey + `","` + ecKey + `"],"system":false,"noCreateHome":false,"noUserGroup":false}],
			"groups":[{"name":"ops","gid":2000,"system":true}]}`},
	{name: "storage kiln applies", body: `"storage":{
		"disks":[{"device":"/dev/disk/by-id/virtio-data","wipeTable":false,"partitions":[
			{"number":1,"label":"data","sizeMiB":1024,"startMiB":0,"typeGuid":"0FC63DAF-8483-4772-8E79-3D69D8477DE4","guid":"8D7B1A34-4F9D-4C3B-9E5F-0C7D2C3B1A01","wipePartitionEntry":true,"shouldExist":true},
			{"number":9,"shouldExist":false}]}],
		"raid":[{"name":"data","level":"raid1","devices":["/dev/vdc","/dev/vdd"],"spares":0,"options":["--metadata=1.2"]}],
		"luks":[{"name":"secret","device":"/dev/md/data","keyFile":{"source":"data:,k"},"label":"secret","uuid":"2b0a6c8e-1bcb-4c4e-8e0b-7f5f2a4d3c11","options":["--cipher","aes-xts-plain64"],"wipeVolume":false,"discard":true,"openOptions":["--perf-no_read_workqueue"]}],
		"filesystems":[{"device":"/dev/mapper/secret","format":"xfs","wipeFilesystem":false,"label":"data","uuid":"4c9e2b5a-8f3d-4e1b-9a6c-2d7f0e5b1c33","options":["-m","reflink=1"],"mountOptions":["noatime","discard"],"path":"/var/lib/containerd"},
			{"device":"/dev/vde","format":"vfat","uuid":"1234-ABCD","path":"/srv/fat"},{"device":"/dev/vdf","format":"swap"}]}`},
	{name: "raid levels by their other names", body: `"storage":{"raid":[
		{"name":"a","level":"stripe","devices":["/dev/vdc","/dev/vdd"]},{"name":"b","level":"mirror","devices":["/dev/vde","/dev/vdf"]},
		{"name":"c","level":"0","devices":["/dev/vdg","/dev/vdh"]},{"name":"d","level":"10","devices":["/dev/vdi","/dev/vdj","/dev/vdk","/dev/vdl"]}]}`},
	{name: "raid5, btrfs, clevis, resize", body: `"storage":{
		"disks":[{"device":"/dev/vdb","partitions":[{"number":1,"resize":true}]}],
		"raid":[{"name":"r","level":"raid5","devices":["/dev/vdc","/dev/vdd","/dev/vde"]}],
		"luks":[{"name":"x","device":"/dev/vdf","clevis":{"tpm2":true}}],
		"filesystems":[{"device":"/dev/vdg","format":"btrfs"}]}`,
		wantUnsupported: true,
		want: []string{"storage.disks[0].partitions[0].resize: resize is not supported: kiln never changes the size of an existing partition",
			`storage.raid[0].level: level "raid5" is not supported (raid0, raid1, raid10 are, and their other names stripe, mirror, 0, 1 and 10)`,
			"storage.luks[0].clevis: clevis (tang, tpm2) is not supported: give a keyFile",
			`storage.filesystems[0].format: format "btrfs" is not supported (ext4, xfs, vfat, swap are)`}},
	{name: "storage values kiln cannot honour", body: `"storage":{
		"luks":[{"name":"x","device":"/dev/vdb","keyFile":{"source":"https://example.com/k"},"openOptions":["--key-slot=1"]}],
		"filesystems":[{"device":"/dev/vdc","format":"ext4","path":"/var"},{"device":"/dev/vdd","format":"swap","path":"/swap"},
			{"device":"/dev/vde","format":"ext4","path":"/data","mountOptions":["ro,exec"]},{"device":"/dev/vdf","format":"vfat","uuid":"not-a-volid"}]}`,
		wantUnsupported: true, // the open option
		want: []string{"storage.luks[0].keyFile.verification.hash: required for an http(s) source",
			`storage.luks[0].openOptions[0]: "--key-slot=1" is not supported: later boots open the volume through /etc/crypttab`,
			"storage.filesystems[0].path: /var is one of the node's own filesystems",
			"storage.filesystems[1].path: a swap area is not mounted",
			`storage.filesystems[2].mountOptions[0]: "ro,exec": one option per entry`,
			`storage.filesystems[3].uuid: "not-a-volid" is not a FAT volume id`}},
	{name: "kernel arguments", body: `"kernelArguments":{"shouldExist":["quiet","console=ttyS1,115200n8"],"shouldNotExist":["mitigations=auto,nosmt"]}`},
	{name: "append", body: `"storage":{"files":[{"path":"/etc/a"},{"path":"/etc/b","append":[{"source":"data:,x"}]}]}`, wantUnsupported: true,
		want: []string{"storage.files[1].append is not supported by kiln yet"}},
	{name: "remote source without hash", body: `"storage":{"files":[{"path":"/etc/a","contents":{"source":"https://example.com/a"}}]}`,
		want: []string{`storage.files[0].contents.verification.hash: required for a https source: kiln verifies every downloaded byte`}},
	{name: "other scheme", body: `"storage":{"files":[{"path":"/etc/a","contents":{"source":"s3://bucket/a","verification":{"hash":"` + hashA + `"}}}]}`, wantUnsupported: true,
		want: []string{`storage.files[0].contents.source: scheme "s3" is not supported by kiln yet`}},
	{name: "http headers", body: `"storage":{"files":[{"path":"/etc/a","contents":{"source":"https://example.com/a","httpHeaders":[{"name":"X","value":"y"}],"verification":{"hash":"` + hashA + `"}}}]}`, wantUnsupported: true,
		want: []string{"storage.files[0].contents.httpHeaders is not supported"}},
	{name: "bad owner name", body: `"storage":{"directories":[{"path":"/d","group":{"name":"Ops Team"}}]}`,
		want: []string{`storage.directories[0].group.name: "Ops Team" is not a valid group name`}},
	{name: "hard link relative, owned", body: `"storage":{"links":[{"path":"/a","target":"b","hard":true,"user":{"id":0}}]}`,
		want: []string{`storage.links[0].target: hard link target "b" must be an absolute path`, "storage.links[0]: a hard link has no owner"}},
	{name: "unit name with slash", body: `"systemd":{"units":[{"name":"../x.service"}]}`,
		want: []string{`systemd.units[0].name: unit name "../x.service" contains a slash`}},
	{name: "mask and enable", body: `"systemd":{"units":[{"name":"x.service","mask":true,"enabled":true}]}`,
		want: []string{"systemd.units[0]: mask and enabled: true contradict each other"}},
	{name: "mask with contents", body: `"systemd":{"units":[{"name":"x.service","mask":true,"contents":"[Service]\n"}]}`,
		want: []string{"systemd.units[0].contents: a masked unit's contents would never be used"}},
	{name: "drop-in without contents", body: `"systemd":{"units":[{"name":"x.service","dropins":[{"name":"a.conf"}]}]}`,
		want: []string{"systemd.units[0].dropins[0].contents: is required"}},
	{name: "bad ssh key", body: `"passwd":{"users":[{"name":"core","sshAuthorizedKeys":["` + edKey + `","ssh-rsa AAAA-not-base64"]}]}`,
		want: []string{"passwd.users[0].sshAuthorizedKeys[1]: not an SSH public key"}},
	{name: "bad user name, home, shell", body: `"passwd":{"users":[{"name":"Root!","homeDir":"home/x","shell":"bash"}]}`,
		want: []string{`passwd.users[0].name: "Root!" is not a valid user name`, "passwd.users[0].homeDir", "passwd.users[0].shell"}},
	{name: "plain-text password", body: `"passwd":{"users":[{"name":"core","passwordHash":"hunter2"}]}`,
		want: []string{"passwd.users[0].passwordHash: is not a crypt(3) hash"}},
	{name: "empty password", body: `"passwd":{"users":[{"name":"core","passwordHash":""}]}`,
		want: []string{"passwd.users[0].passwordHash: an empty hash allows logging in without a password"}},
	{name: "user removal", body: `"passwd":{"users":[{"name":"core","shouldExist":false}]}`, wantUnsupported: true,
		want: []string{"passwd.users[0].shouldExist is not supported by kiln yet"}},
	{name: "group password", body: `"passwd":{"groups":[{"name":"ops","passwordHash":"$6$a$b"}]}`, wantUnsupported: true,
		want: []string{"passwd.groups[0].passwordHash is not supported by kiln yet"}},
	{name: "several at once", body: `"passwd":{"users":[{"name":"core","noLogInit":true}]},"storage":{"raid":[{"name":"r","level":"raid6","devices":["/dev/vdb"]}]}`, wantUnsupported: true,
		want: []string{"passwd.users[0].noLogInit", "storage.raid[0].level"}},
}

func TestValidate(t *testing.T) {
	for _, tc := range validateCases {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := Parse([]byte(`{"ignition":{"version":"3.5.0"},` + tc.body + `}`))
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
			if !errors.As(err, &fe) {
				t.Errorf("Validate error %v is not a *FieldError", err)
			}
			if got := errors.Is(err, errUnsupported); got != tc.wantUnsupported {
				t.Errorf("errors.Is(err, errUnsupported) = %v, want %v", got, tc.wantUnsupported)
			}
		})
	}
}

func TestValidateIgnitionSection(t *testing.T) {
	tests := []struct{ name, ignition, want string }{
		{"merge headers", `"config":{"merge":[{"source":"https://h/a.ign","httpHeaders":[{"name":"X","value":"y"}],"verification":{"hash":"` + hashA + `"}}]}`,
			"ignition.config.merge[0].httpHeaders is not supported by kiln yet"},
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
	gzURL := dataurl.EncodeBytes(testkit.Gzip(t, unit))

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
		spec    string // ignition.version; 3.4.0 when empty
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
		{name: "setuid mode", spec: "3.6.0", file: `{"path":"/usr/local/bin/x","mode":2541,"contents":{"source":"data:,x"}}`,
			want: want{path: "/usr/local/bin/x", mode: 0o755 | fs.ModeSetuid, modeSet: true, hasContents: true, contents: "x"}},
		// Below spec 3.6.0 Ignition masks the special bits out (and Parse warns, TestParseWarnings).
		{name: "setuid mode before 3.6", file: `{"path":"/usr/local/bin/x","mode":2541,"contents":{"source":"data:,x"}}`,
			want: want{path: "/usr/local/bin/x", mode: 0o755, modeSet: true, hasContents: true, contents: "x"}},
		{name: "no contents", file: `{"path":"/etc/empty"}`, want: want{path: "/etc/empty"}},
		{name: "hash mismatch", file: fmt.Sprintf(`{"path":"/a","contents":{"source":"data:,tampered","verification":{"hash":"sha256-%s"}}}`, hex.EncodeToString(s256[:])),
			wantErr: "storage.files[0].contents.verification.hash: sha256 mismatch"},
		{name: "gzip flag on plain data", file: `{"path":"/a","contents":{"source":"data:,plain","compression":"gzip"}}`,
			wantErr: "storage.files[0].contents: gunzip"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			spec := tc.spec
			if spec == "" {
				spec = "3.4.0"
			}
			cfg, err := Parse([]byte(`{"ignition":{"version":"` + spec + `"},"storage":{"files":[` + tc.file + `]}}`))
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

func TestTranslateButane(t *testing.T) {
	js, err := TranslateButane([]byte(`variant: fcos
version: 1.7.0
passwd:
  users:
    - name: core
      ssh_authorized_keys: ["` + edKey + `"]
systemd:
  units:
    - name: hello.service
      enabled: true
      contents: |
        [Service]
        ExecStart=/bin/echo hello
        [Install]
        WantedBy=multi-user.target
`))
	if err != nil {
		t.Fatalf("TranslateButane: %v", err)
	}
	if !bytes.HasPrefix(js, []byte(`{"ignition":{"version":"3.6.0"}`)) {
		t.Errorf("output does not start like Ignition 3.6 JSON: %.80s", js)
	}
	cfg, err := Parse(js)
	if err != nil {
		t.Fatalf("Parse(translated): %v", err)
	}
	if err := cfg.Validate(); err != nil {
		t.Errorf("Validate: %v", err)
	}
	if u := cfg.Ignition.Passwd.Users; len(u) != 1 || u[0].Name != "core" || len(u[0].SSHAuthorizedKeys) != 1 {
		t.Errorf("users = %+v", u)
	}
	if _, err := TranslateButane([]byte("variant: fcos\nversion: 1.6.0\npasswd: {users: [{nme: core}]}\n")); err == nil ||
		!strings.Contains(err.Error(), "passwd.users[0].nme: unused key nme (line 3") {
		t.Errorf("TranslateButane(typo) = %v, want an error naming passwd.users[0].nme with its line", err)
	}
}

func TestMerge(t *testing.T) {
	base := mustParse(t, `{"ignition":{"version":"3.5.0"},
		"storage":{"files":[{"path":"/etc/a","contents":{"source":"data:,base-a"}},{"path":"/etc/b","contents":{"source":"data:,base-b"}}]},
		"systemd":{"units":[{"name":"x.service","enabled":true}]}}`)
	// The user config is Butane: both kinds merge the same way.
	user := mustParse(t, "variant: fcos\nversion: 1.6.0\nstorage:\n  files:\n    - path: /etc/a\n      overwrite: true\n      contents: {inline: user-a}\n    - path: /etc/c\n      contents: {inline: user-c}\nsystemd:\n  units:\n    - name: x.service\n      enabled: false\n")

	got := Merge(base, user)
	files, err := got.Files()
	if err != nil {
		t.Fatal(err)
	}
	contents := map[string]string{}
	for _, f := range files {
		contents[f.Path] = string(f.Contents)
	}
	want := map[string]string{"/etc/a": "user-a", "/etc/b": "base-b", "/etc/c": "user-c"}
	if fmt.Sprint(contents) != fmt.Sprint(want) {
		t.Errorf("merged files = %v, want %v", contents, want)
	}
	if u := got.Ignition.Systemd.Units; len(u) != 1 || u[0].Enabled == nil || *u[0].Enabled {
		t.Errorf("merged units = %+v, want x.service disabled (user wins)", u)
	}
	if Merge(nil, user) != user || Merge(base, nil) != base || Merge(nil, nil) != nil {
		t.Error("Merge with a nil side should return the other side")
	}
	// The inputs are not modified.
	if f, _ := base.Files(); string(f[0].Contents) != "base-a" {
		t.Errorf("base changed by Merge: %q", f[0].Contents)
	}
}

func mustParse(t *testing.T, s string) *Config {
	t.Helper()
	c, err := Parse([]byte(s))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return c
}

func TestFetch(t *testing.T) {
	body := []byte("remote bytes\n")
	sum := sha256.Sum256(body)
	hash := "sha256-" + hex.EncodeToString(sum[:])
	tests := []struct {
		name, source, compression, hash string
		served                          []byte
		getErr                          error
		want                            string
		wantErr                         string
	}{
		{name: "plain", source: "https://example.com/a", hash: hash, served: body, want: string(body)},
		{name: "gzip", source: "http://example.com/a.gz", compression: "gzip", hash: hash, served: testkit.Gzip(t, body), want: string(body)},
		{name: "tampered", source: "https://example.com/a", hash: hash, served: []byte("evil"), wantErr: "storage.files[0].contents.verification.hash: sha256 mismatch"},
		{name: "server error", source: "https://example.com/a", hash: hash, getErr: errors.New("404 Not Found"), wantErr: "storage.files[0].contents.source: fetch https://example.com/a: 404 Not Found"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			raw := fmt.Sprintf(`{"ignition":{"version":"3.5.0"},"storage":{"files":[{"path":"/etc/a","user":{"name":"core"},"contents":{"source":%q,"compression":%q,"verification":{"hash":%q}}}]}}`,
				tc.source, tc.compression, tc.hash)
			cfg := mustParse(t, raw)
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			files, err := cfg.Files()
			if err != nil {
				t.Fatal(err)
			}
			f := files[0]
			if !f.Remote() || f.Contents != nil || !f.HasContents || f.User.Name != "core" {
				t.Fatalf("unfetched file = %+v", f)
			}
			var asked string
			got, err := f.Fetch(context.Background(), func(_ context.Context, url string) ([]byte, error) {
				asked = url
				return tc.served, tc.getErr
			})
			if asked != tc.source {
				t.Errorf("getter asked for %q, want %q", asked, tc.source)
			}
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Fetch error = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if string(got.Contents) != tc.want || got.Remote() {
				t.Errorf("fetched = %q (remote %v), want %q", got.Contents, got.Remote(), tc.want)
			}
		})
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(filesCfg))
	f.Add(testkit.Gzip(f, []byte(filesCfg)))
	f.Add([]byte(`{"ignition":{"version":"3.0.0"},"passwd":{"users":[{"name":"core","sshAuthorizedKeys":["ssh-ed25519 AAAA"]}]}}`))
	f.Add([]byte(`{"ignition":{"version":"3.5.0"},"storage":{"files":[{"path":"/a","mode":493,"contents":{"source":"data:,x","compression":"gzip","verification":{"hash":"sha512-00"}}}]}}`))
	f.Add([]byte(`{"ignition":{"version":"3.2.0","config":{"merge":[{"source":"data:,%7B%7D"}]}},"systemd":{"units":[{"name":"a.service"}]}}`))
	f.Add([]byte(`{}`))
	f.Add([]byte{0x1f, 0x8b})
	f.Add([]byte("variant: fcos\nversion: 1.6.0\nstorage:\n  files:\n    - path: /etc/a\n      mode: 0644\n      contents:\n        inline: hello\n"))
	f.Add([]byte("variant: fcos\nversion: 1.4.0\npasswd:\n  users:\n    - name: core\n      ssh_authorized_keys: [\"" + edKey + "\"]\n      groups: [sudo]\n"))
	f.Add([]byte("variant: fcos\nversion: 1.6.0\nsystemd:\n  units:\n    - name: a.service\n      enabled: true\n      contents: |\n        [Service]\n        ExecStart=/bin/true\n      dropins:\n        - name: x.conf\n          contents: \"[Unit]\\n\"\n"))
	f.Add([]byte("variant: fcos\nversion: 1.6.0\nstorage:\n  links:\n    - path: /a\n      target: /b\n      hard: true\n  directories:\n    - path: /d\n      mode: 0700\n"))
	f.Add([]byte("variant: fcos\nversion: 1.6.0\nstorage:\n  disks:\n    - device: /dev/vdb\n      wipe_table: true\n  filesystems:\n    - device: /dev/vdb\n      format: ext4\n      path: /var/lib/etcd\n      with_mount_unit: true\n"))
	f.Add([]byte("variant: fcos\nversion: 1.6.0\nstorage: {files: [{path: /x, contents: {source: \"https://e/x\", verification: {hash: sha512-00}}}]}\n"))
	f.Add([]byte("#cloud-config\n"))
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
			if f.Remote() && f.Hash == "" {
				t.Fatalf("remote file %s passed Validate without a hash", f.Path)
			}
		}
	})
}

// Butane's sugar for the boot disk is refused by the key the user wrote; local keys read
// files below Options.FilesDir and nowhere else.
func TestButaneSugarAndLocal(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "motd"), []byte("hello\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "id.pub"), []byte(edKey+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, yml, filesDir, wantErr string
	}{
		{name: "boot_device mirror", yml: "variant: fcos\nversion: 1.7.0\nboot_device:\n  mirror:\n    devices: [/dev/sda, /dev/sdb]\n",
			wantErr: "butane: boot_device (line 3): not supported: it mirrors or encrypts the boot disk"},
		{name: "grub users", yml: "variant: fcos\nversion: 1.7.0\ngrub:\n  users:\n    - name: root\n      password_hash: x\n",
			wantErr: "butane: grub (line 3): not supported"},
		{name: "local without a files dir", yml: "variant: fcos\nversion: 1.7.0\nstorage:\n  files:\n    - path: /etc/motd\n      contents: {local: motd}\n",
			wantErr: "storage.files[0].contents.local"},
		{name: "local outside the files dir", filesDir: dir, yml: "variant: fcos\nversion: 1.7.0\nstorage:\n  files:\n    - path: /etc/motd\n      contents: {local: ../motd}\n",
			wantErr: "storage.files[0].contents.local"},
		{name: "local file and ssh keys", filesDir: dir, yml: "variant: fcos\nversion: 1.7.0\nstorage:\n  files:\n    - path: /etc/motd\n      contents: {local: motd}\npasswd:\n  users:\n    - name: core\n      ssh_authorized_keys_local: [id.pub]\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := ParseWith([]byte(tc.yml), Options{FilesDir: tc.filesDir})
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("ParseWith error = %v, want it to contain %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			files, err := cfg.Files()
			if err != nil || len(files) != 1 || string(files[0].Contents) != "hello\n" {
				t.Errorf("files = %+v, %v; want /etc/motd holding hello", files, err)
			}
			if u := cfg.Ignition.Passwd.Users; len(u) != 1 || len(u[0].SSHAuthorizedKeys) != 1 || string(u[0].SSHAuthorizedKeys[0]) != edKey {
				t.Errorf("users = %+v, want core with the key from id.pub", u)
			}
		})
	}
}

// A swap area is refused on every node that runs kubelet, and only there.
func TestCheckRoleSwap(t *testing.T) {
	cfg, err := Parse([]byte(`{"ignition":{"version":"3.5.0"},"storage":{"filesystems":[
		{"device":"/dev/vdb","format":"ext4","path":"/srv"},{"device":"/dev/vdc","format":"swap"}]}}`))
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	for _, tc := range []struct {
		role Role
		want string
	}{
		{RoleWorker, "storage.filesystems[1].format: swap is refused on this worker node: kubelet runs there and refuses to start while swap is on (failSwapOn)"},
		{RoleControlPlane, "storage.filesystems[1].format: swap is refused on this control-plane node"},
		{RoleEtcd, "storage.filesystems[1].format: swap is refused on this etcd node"},
		{"bastion", ""},
	} {
		err := cfg.CheckRole(tc.role)
		if tc.want == "" {
			if err != nil {
				t.Errorf("CheckRole(%s) = %v, want nil", tc.role, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("CheckRole(%s) = %v, want %q", tc.role, err, tc.want)
		}
	}
}
