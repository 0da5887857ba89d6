package install

import (
	"strings"
	"testing"
)

func TestParseParams(t *testing.T) {
	const sum = "3f79bb7b435b05321651daefd374cdc681dc06faa65e374e38337b88ca046dea"
	good := func(kv ...string) map[string]string {
		m := map[string]string{ParamDev: "auto", ParamImageURL: "http://10.0.2.2:8080/img/metal-worker.raw.zst", ParamImageHash: sum}
		for i := 0; i+1 < len(kv); i += 2 {
			if kv[i+1] == "<unset>" {
				delete(m, kv[i])
				continue
			}
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	tests := []struct {
		name    string
		kiln    map[string]string
		dev     string
		wipe    bool
		wantErr string
	}{
		{name: "auto", kiln: good(), dev: "auto"},
		{name: "device path, wipe", kiln: good(ParamDev, "/dev/vda", ParamWipe, "1"), dev: "/dev/vda", wipe: true},
		{name: "by-id name", kiln: good(ParamDev, "virtio-os"), dev: "virtio-os"},
		{name: "by-id path", kiln: good(ParamDev, "/dev/disk/by-id/nvme-QEMU_NVMe_Ctrl_os"), dev: "nvme-QEMU_NVMe_Ctrl_os"},
		{name: "upper-case hash", kiln: good(ParamImageHash, strings.ToUpper(sum)), dev: "auto"},
		{name: "wipe=0", kiln: good(ParamWipe, "0"), dev: "auto"},
		{name: "no dev", kiln: good(ParamDev, "<unset>"), wantErr: "kiln.install.dev= is missing"},
		{name: "path outside /dev", kiln: good(ParamDev, "/tmp/disk"), wantErr: "kiln.install.dev=/tmp/disk: a device path must be under /dev"},
		{name: "unclean path", kiln: good(ParamDev, "/dev/../etc/passwd"), wantErr: "kiln.install.dev=/dev/../etc/passwd: not a clean path"},
		{name: "by-id name with a slash", kiln: good(ParamDev, "a/b"), wantErr: "kiln.install.dev=a/b: not a name in /dev/disk/by-id/"},
		{name: "no image", kiln: good(ParamImageURL, "<unset>"), wantErr: "kiln.install.image_url= is missing"},
		{name: "ftp image", kiln: good(ParamImageURL, "ftp://host/img.raw"), wantErr: "kiln.install.image_url=ftp://host/img.raw: want an http:// or https:// URL"},
		{name: "image URL without a file", kiln: good(ParamImageURL, "http://host/"), wantErr: "kiln.install.image_url=http://host/: the URL names no file"},
		{name: "no hash", kiln: good(ParamImageHash, "<unset>"), wantErr: `kiln.install.image_sha256="": want the 64 hex digits`},
		{name: "short hash", kiln: good(ParamImageHash, sum[:63]), wantErr: "kiln.install.image_sha256="},
		{name: "wipe=yes", kiln: good(ParamWipe, "yes"), wantErr: `kiln.install.wipe="yes": want 1`},
		{name: "bare wipe", kiln: good(ParamWipe, ""), wantErr: `kiln.install.wipe="": want 1`},
		{name: "misspelt parameter", kiln: good("install.wpie", "1"), wantErr: "kiln.install.wpie: unknown install parameter"},
		{name: "config URL with a quote", kiln: good(ParamConfigURL, `http://h/"x`), wantErr: "kiln.config.url="},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := ParseParams(tt.kiln)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("ParseParams error = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if p.Dev != tt.dev || p.Wipe != tt.wipe || p.SHA256 != sum || p.ImageName() != "metal-worker.raw.zst" {
				t.Errorf("ParseParams = %+v", p)
			}
		})
	}
}
