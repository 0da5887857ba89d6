package stage1

import (
	"cmp"
	"encoding/hex"
	"strings"
	"testing"
	"time"
)

func TestParseCmdline(t *testing.T) {
	const id = "6b1c7a36-1f4e-4d0a-9a55-0c3b1e2f4a5b"
	sum := strings.Repeat("0123456789abcdef", 4)
	tests := []struct {
		name     string
		in       string
		want     Cmdline
		wantErr  string
		platform string
		mode     Mode
	}{
		{
			name: "contract line",
			in:   "root=PARTUUID=" + id + " rootfstype=erofs ro kiln.platform=qemu console=ttyS0,115200 quiet\n",
			want: Cmdline{rootPARTUUID: id, rootFSType: "erofs", RootWait: defaultRootWait,
				Kiln: map[string]string{"platform": "qemu"}},
			platform: "qemu",
		},
		{
			name: "uppercase guid is lowered, no rootfstype",
			in:   "BOOT_IMAGE=/kiln/a/vmlinuz root=PARTUUID=" + strings.ToUpper(id) + " ro",
			want: Cmdline{rootPARTUUID: id, RootWait: defaultRootWait, Kiln: map[string]string{}},
		},
		{
			name: "last of ro/rw wins, quotes group, kiln keys without value",
			in:   `ro root=PARTUUID=` + id + ` rw kiln.debug kiln.note="a b c" kiln.rootwait=90`,
			want: Cmdline{rootPARTUUID: id, readWrite: true, RootWait: 90 * time.Second,
				Kiln: map[string]string{"debug": "", "note": "a b c", "rootwait": "90"}},
		},
		{
			name: "rootwait as duration, args after -- are init's",
			in:   "root=PARTUUID=" + id + " kiln.rootwait=1m30s -- kiln.platform=aws",
			want: Cmdline{rootPARTUUID: id, RootWait: 90 * time.Second, Kiln: map[string]string{"rootwait": "1m30s"}},
		},
		{
			name: "carriage returns separate, a quoted whole parameter",
			in:   "root=PARTUUID=" + id + "\r\n\"kiln.note=a b\"\rkiln.platform=aws\r\n",
			want: Cmdline{rootPARTUUID: id, RootWait: defaultRootWait,
				Kiln: map[string]string{"note": "a b", "platform": "aws"}},
			platform: "aws",
		},
		{
			name: "live without root=, defaults",
			in:   "console=ttyS0 kiln.live.rootfs_url=http://10.0.2.2:8080/w/rootfs.img kiln.live.rootfs_sha256=" + strings.ToUpper(sum),
			want: Cmdline{RootWait: defaultRootWait, netTimeout: defaultNetTimeout,
				live: liveRoot{url: "http://10.0.2.2:8080/w/rootfs.img", sha256: sum},
				Kiln: map[string]string{"live.rootfs_url": "http://10.0.2.2:8080/w/rootfs.img", "live.rootfs_sha256": strings.ToUpper(sum)}},
			mode: modeLive,
		},
		{
			name: "live over https with a data disk by-id and a net timeout",
			in:   "kiln.live.rootfs_url=https://boot.example/r.img kiln.live.rootfs_sha256=" + sum + " kiln.data.dev=virtio-data1 kiln.net.timeout=2m",
			want: Cmdline{RootWait: defaultRootWait, netTimeout: 2 * time.Minute, dataDev: "virtio-data1",
				live: liveRoot{url: "https://boot.example/r.img", sha256: sum},
				Kiln: map[string]string{"live.rootfs_url": "https://boot.example/r.img", "live.rootfs_sha256": sum, "data.dev": "virtio-data1", "net.timeout": "2m"}},
			mode: modeLive,
		},
		{
			name: "live from the boot medium",
			in:   "ro kiln.platform=metal kiln.live.rootfs_url=medium:/kiln/root.img kiln.live.rootfs_sha256=" + sum,
			want: Cmdline{RootWait: defaultRootWait, netTimeout: defaultNetTimeout,
				live: liveRoot{url: "medium:/kiln/root.img", sha256: sum},
				Kiln: map[string]string{"platform": "metal", "live.rootfs_url": "medium:/kiln/root.img", "live.rootfs_sha256": sum}},
			mode: modeLive, platform: "metal",
		},
		{
			name: "install without root= is left to the installer",
			in:   "kiln.install.dev=auto kiln.install.image_url=http://h/i.raw.zst kiln.install.image_sha256=" + sum + " kiln.net.timeout=30",
			want: Cmdline{RootWait: defaultRootWait, netTimeout: 30 * time.Second,
				Kiln: map[string]string{"install.dev": "auto", "install.image_url": "http://h/i.raw.zst", "install.image_sha256": sum, "net.timeout": "30"}},
			mode: modeInstall,
		},
		{
			name: "disk boot with a data disk path",
			in:   "root=PARTUUID=" + id + " kiln.data.dev=/dev/vdb",
			want: Cmdline{rootPARTUUID: id, RootWait: defaultRootWait, netTimeout: defaultNetTimeout, dataDev: "/dev/vdb",
				Kiln: map[string]string{"data.dev": "/dev/vdb"}},
			mode: modeDisk,
		},
		{name: "root missing", in: "ro quiet kiln.platform=qemu", wantErr: "root= is missing"},
		{name: "live and install", in: "kiln.live.rootfs_url=http://h/r kiln.live.rootfs_sha256=" + sum + " kiln.install.image_url=http://h/i",
			wantErr: "both set"},
		{name: "live url without sha256", in: "kiln.live.rootfs_url=http://h/r", wantErr: "needs kiln.live.rootfs_sha256="},
		{name: "live sha256 without url", in: "kiln.live.rootfs_sha256=" + sum, wantErr: "without kiln.live.rootfs_url="},
		{name: "live sha256 too short", in: "kiln.live.rootfs_url=http://h/r kiln.live.rootfs_sha256=" + sum[:63], wantErr: "kiln.live.rootfs_sha256=" + sum[:63] + ": not a sha256"},
		{name: "live sha256 not hex", in: "kiln.live.rootfs_url=http://h/r kiln.live.rootfs_sha256=" + strings.Repeat("g", 64), wantErr: "not a sha256"},
		{name: "live medium path relative", in: "kiln.live.rootfs_url=medium:kiln/root.img kiln.live.rootfs_sha256=" + sum, wantErr: `kiln.live.rootfs_url=medium:kiln/root.img: "kiln/root.img" is not an absolute, clean path`},
		{name: "live medium path escapes", in: "kiln.live.rootfs_url=medium:/kiln/../x kiln.live.rootfs_sha256=" + sum, wantErr: "not an absolute, clean path"},
		{name: "live url tftp", in: "kiln.live.rootfs_url=tftp://h/r kiln.live.rootfs_sha256=" + sum, wantErr: `kiln.live.rootfs_url=tftp://h/r: scheme "tftp" is not supported`},
		{name: "live url relative", in: "kiln.live.rootfs_url=/r.img kiln.live.rootfs_sha256=" + sum, wantErr: "scheme \"\" is not supported"},
		{name: "live url without host", in: "kiln.live.rootfs_url=http:///r.img kiln.live.rootfs_sha256=" + sum, wantErr: "has no host"},
		{name: "unknown live key", in: "kiln.live.rootfs=http://h/r", wantErr: "kiln.live.rootfs is not a live boot parameter"},
		{name: "data dev outside /dev", in: "root=PARTUUID=" + id + " kiln.data.dev=/tmp/x", wantErr: "kiln.data.dev=/tmp/x: a device path must lie under /dev"},
		{name: "data dev dotdot", in: "root=PARTUUID=" + id + " kiln.data.dev=/dev/../etc/passwd", wantErr: "must lie under /dev"},
		{name: "data dev relative path", in: "root=PARTUUID=" + id + " kiln.data.dev=disk/by-id/x", wantErr: "not a /dev path nor"},
		{name: "data dev empty", in: "root=PARTUUID=" + id + " kiln.data.dev=", wantErr: "kiln.data.dev=: empty"},
		{name: "net timeout zero", in: "root=PARTUUID=" + id + " kiln.net.timeout=0", wantErr: "kiln.net.timeout=0: must be more than 0"},
		{name: "net timeout bad", in: "root=PARTUUID=" + id + " kiln.net.timeout=long", wantErr: "kiln.net.timeout=long: not a duration"},
		{name: "root by device name", in: "root=/dev/vda2 ro", wantErr: "root=/dev/vda2 is not supported"},
		{
			name: "verified root",
			in:   "root=PARTUUID=" + id + " kiln.verity.roothash=" + sum + " kiln.verity.hashoffset=8192",
			want: Cmdline{rootPARTUUID: id, RootWait: defaultRootWait, verity: &verityArgs{rootHash: mustHex(sum), hashOffset: 8192},
				Kiln: map[string]string{"verity.roothash": sum, "verity.hashoffset": "8192"}},
		},
		{name: "verity hash without offset", in: "root=PARTUUID=" + id + " kiln.verity.roothash=" + sum, wantErr: "kiln.verity.roothash= and kiln.verity.hashoffset= go together"},
		{name: "verity offset not a block", in: "root=PARTUUID=" + id + " kiln.verity.roothash=" + sum + " kiln.verity.hashoffset=1000", wantErr: "kiln.verity.hashoffset=1000: want a positive multiple of 4096"},
		{name: "verity hash short", in: "root=PARTUUID=" + id + " kiln.verity.roothash=" + sum[:60] + " kiln.verity.hashoffset=4096", wantErr: "want 64 hex digits"},
		{name: "unknown verity key", in: "root=PARTUUID=" + id + " kiln.verity.salt=00", wantErr: "kiln.verity.salt is not a verity parameter"},
		{name: "root by fs uuid", in: "root=UUID=" + id, wantErr: "want root=PARTUUID=<guid>"},
		{name: "bad guid", in: "root=PARTUUID=1234", wantErr: `"1234" is not a partition GUID`},
		{name: "partnroff form", in: "root=PARTUUID=" + id + "/PARTNROFF=1", wantErr: "is not a partition GUID"},
		{name: "bad rootwait", in: "root=PARTUUID=" + id + " kiln.rootwait=soon", wantErr: "kiln.rootwait=soon"},
		{name: "empty kiln key", in: "root=PARTUUID=" + id + " kiln.=x", wantErr: "empty kiln.* key"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseCmdline(tt.in)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("ParseCmdline(%q) error = %v, want it to contain %q", tt.in, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseCmdline(%q): %v", tt.in, err)
			}
			if got.Raw != strings.TrimSpace(tt.in) {
				t.Errorf("Raw = %q", got.Raw)
			}
			if got.rootPARTUUID != tt.want.rootPARTUUID || got.rootFSType != tt.want.rootFSType ||
				got.readWrite != tt.want.readWrite || got.RootWait != tt.want.RootWait ||
				got.live != tt.want.live || got.dataDev != tt.want.dataDev || got.verity.hex() != tt.want.verity.hex() ||
				(got.verity != nil && got.verity.hashOffset != tt.want.verity.hashOffset) {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
			if len(got.Kiln) != len(tt.want.Kiln) {
				t.Errorf("Kiln = %v, want %v", got.Kiln, tt.want.Kiln)
			}
			if want := cmp.Or(tt.want.netTimeout, defaultNetTimeout); got.netTimeout != want {
				t.Errorf("NetTimeout = %s, want %s", got.netTimeout, want)
			}
			if want := cmp.Or(tt.mode, modeDisk); got.mode() != want {
				t.Errorf("Mode() = %q, want %q", got.mode(), want)
			}
			for k, v := range tt.want.Kiln {
				if gv, ok := got.Kiln[k]; !ok || gv != v {
					t.Errorf("Kiln[%q] = %q (present %v), want %q", k, gv, ok, v)
				}
			}
			if got.platform() != tt.platform && tt.platform != "" {
				t.Errorf("Platform() = %q, want %q", got.platform(), tt.platform)
			}
		})
	}
}

func mustHex(s string) []byte {
	b, err := hex.DecodeString(s)
	if err != nil {
		panic(err)
	}
	return b
}
