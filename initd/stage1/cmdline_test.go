package stage1

import (
	"strings"
	"testing"
	"time"
)

func TestParseCmdline(t *testing.T) {
	const id = "6b1c7a36-1f4e-4d0a-9a55-0c3b1e2f4a5b"
	tests := []struct {
		name     string
		in       string
		want     Cmdline
		wantErr  string
		platform string
	}{
		{
			name: "contract line",
			in:   "root=PARTUUID=" + id + " rootfstype=erofs ro kiln.platform=qemu console=ttyS0,115200 quiet\n",
			want: Cmdline{RootPARTUUID: id, RootFSType: "erofs", RootWait: DefaultRootWait,
				Kiln: map[string]string{"platform": "qemu"}},
			platform: "qemu",
		},
		{
			name: "uppercase guid is lowered, no rootfstype",
			in:   "BOOT_IMAGE=/kiln/a/vmlinuz root=PARTUUID=" + strings.ToUpper(id) + " ro",
			want: Cmdline{RootPARTUUID: id, RootWait: DefaultRootWait, Kiln: map[string]string{}},
		},
		{
			name: "last of ro/rw wins, quotes group, kiln keys without value",
			in:   `ro root=PARTUUID=` + id + ` rw kiln.debug kiln.note="a b c" kiln.rootwait=90`,
			want: Cmdline{RootPARTUUID: id, ReadWrite: true, RootWait: 90 * time.Second,
				Kiln: map[string]string{"debug": "", "note": "a b c", "rootwait": "90"}},
		},
		{
			name: "rootwait as duration, args after -- are init's",
			in:   "root=PARTUUID=" + id + " kiln.rootwait=1m30s -- kiln.platform=aws",
			want: Cmdline{RootPARTUUID: id, RootWait: 90 * time.Second, Kiln: map[string]string{"rootwait": "1m30s"}},
		},
		{
			name: "carriage returns separate, a quoted whole parameter",
			in:   "root=PARTUUID=" + id + "\r\n\"kiln.note=a b\"\rkiln.platform=aws\r\n",
			want: Cmdline{RootPARTUUID: id, RootWait: DefaultRootWait,
				Kiln: map[string]string{"note": "a b", "platform": "aws"}},
			platform: "aws",
		},
		{name: "root missing", in: "ro quiet kiln.platform=qemu", wantErr: "root= is missing"},
		{name: "root by device name", in: "root=/dev/vda2 ro", wantErr: "root=/dev/vda2 is not supported"},
		{name: "root by fs uuid", in: "root=UUID=" + id, wantErr: "want root=PARTUUID=<guid>"},
		{name: "bad guid", in: "root=PARTUUID=1234", wantErr: `"1234" is not a partition GUID`},
		{name: "partnroff form", in: "root=PARTUUID=" + id + "/PARTNROFF=1", wantErr: "is not a partition GUID"},
		{name: "bad rootwait", in: "root=PARTUUID=" + id + " kiln.rootwait=soon", wantErr: "kiln.rootwait=soon"},
		{name: "empty kiln key", in: "root=PARTUUID=" + id + " kiln.=x", wantErr: "empty kiln.* key"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseCmdline(tt.in)
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
			if got.RootPARTUUID != tt.want.RootPARTUUID || got.RootFSType != tt.want.RootFSType ||
				got.ReadWrite != tt.want.ReadWrite || got.RootWait != tt.want.RootWait {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
			if len(got.Kiln) != len(tt.want.Kiln) {
				t.Errorf("Kiln = %v, want %v", got.Kiln, tt.want.Kiln)
			}
			for k, v := range tt.want.Kiln {
				if gv, ok := got.Kiln[k]; !ok || gv != v {
					t.Errorf("Kiln[%q] = %q (present %v), want %q", k, gv, ok, v)
				}
			}
			if got.Platform() != tt.platform && tt.platform != "" {
				t.Errorf("Platform() = %q, want %q", got.Platform(), tt.platform)
			}
		})
	}
}
