package install

import (
	"strings"
	"testing"
)

func TestParseParams(t *testing.T) {
	const sum = "3f79bb7b435b05321651daefd374cdc681dc06faa65e374e38337b88ca046dea"
	good := func(kv ...string) map[string]string {
		m := map[string]string{paramDev: "auto", paramImageURL: "http://10.0.2.2:8080/img/metal-worker.raw.zst", paramImageHash: sum}
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
		medium  string // the image's path on the boot medium, for a medium: URL
		wantErr string
	}{
		{name: "auto", kiln: good(), dev: "auto"},
		{name: "device path, wipe", kiln: good(paramDev, "/dev/vda", paramWipe, "1"), dev: "/dev/vda", wipe: true},
		{name: "by-id name", kiln: good(paramDev, "virtio-os"), dev: "virtio-os"},
		{name: "by-id path", kiln: good(paramDev, "/dev/disk/by-id/nvme-QEMU_NVMe_Ctrl_os"), dev: "nvme-QEMU_NVMe_Ctrl_os"},
		{name: "upper-case hash", kiln: good(paramImageHash, strings.ToUpper(sum)), dev: "auto"},
		{name: "wipe=0", kiln: good(paramWipe, "0"), dev: "auto"},
		{name: "image on the boot medium", kiln: good(paramImageURL, "medium:/kiln/metal-worker.raw.zst"), dev: "auto", medium: "/kiln/metal-worker.raw.zst"},
		{name: "relative medium path", kiln: good(paramImageURL, "medium:kiln/disk.raw.zst"), wantErr: "kiln.install.image_url=medium:kiln/disk.raw.zst: \"kiln/disk.raw.zst\" is not an absolute, clean path"},
		{name: "unclean medium path", kiln: good(paramImageURL, "medium:/kiln/../etc"), wantErr: "is not an absolute, clean path"},
		{name: "no dev", kiln: good(paramDev, "<unset>"), wantErr: "kiln.install.dev= is missing"},
		{name: "path outside /dev", kiln: good(paramDev, "/tmp/disk"), wantErr: "kiln.install.dev=/tmp/disk: a device path must be under /dev"},
		{name: "unclean path", kiln: good(paramDev, "/dev/../etc/passwd"), wantErr: "kiln.install.dev=/dev/../etc/passwd: not a clean path"},
		{name: "by-id name with a slash", kiln: good(paramDev, "a/b"), wantErr: "kiln.install.dev=a/b: not a name in /dev/disk/by-id/"},
		{name: "no image", kiln: good(paramImageURL, "<unset>"), wantErr: "kiln.install.image_url= is missing"},
		{name: "ftp image", kiln: good(paramImageURL, "ftp://host/img.raw"), wantErr: "kiln.install.image_url=ftp://host/img.raw: want an http:// or https:// URL"},
		{name: "image URL without a file", kiln: good(paramImageURL, "http://host/"), wantErr: "kiln.install.image_url=http://host/: the URL names no file"},
		{name: "no hash", kiln: good(paramImageHash, "<unset>"), wantErr: `kiln.install.image_sha256="": want the 64 hex digits`},
		{name: "short hash", kiln: good(paramImageHash, sum[:63]), wantErr: "kiln.install.image_sha256="},
		{name: "wipe=yes", kiln: good(paramWipe, "yes"), wantErr: `kiln.install.wipe="yes": want 1`},
		{name: "bare wipe", kiln: good(paramWipe, ""), wantErr: `kiln.install.wipe="": want 1`},
		{name: "misspelt parameter", kiln: good("install.wpie", "1"), wantErr: "kiln.install.wpie: unknown install parameter"},
		{name: "config URL with a quote", kiln: good(paramConfigURL, `http://h/"x`), wantErr: "kiln.config.url="},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := parseParams(tt.kiln)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("ParseParams error = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if p.dev != tt.dev || p.wipe != tt.wipe || p.sha256 != sum || p.imageName() != "metal-worker.raw.zst" || p.mediumFile != tt.medium {
				t.Errorf("ParseParams = %+v", p)
			}
		})
	}
}
