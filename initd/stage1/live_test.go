package stage1

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kilnproject/kiln/initd/stage1/liveroot"
	"github.com/kilnproject/kiln/internal/testkit"
)

// attachedTo lists the loop devices whose backing file lies in dir.
func attachedTo(t *testing.T, dir string) []string {
	t.Helper()
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	var devs []string
	for _, f := range files {
		b, _ := os.ReadFile(f)
		if strings.HasPrefix(strings.TrimSpace(string(b)), dir+"/") {
			devs = append(devs, strings.Split(f, "/")[3])
		}
	}
	return devs
}

func TestMountLiveRoot(t *testing.T) {
	testkit.RequireRoot(t, "tmpfs, loop devices and mounts")
	mksquashfs := testkit.Tool(t, "mksquashfs", "squashfs-tools")
	src := t.TempDir()
	os.MkdirAll(filepath.Join(src, "etc"), 0o755)
	os.WriteFile(filepath.Join(src, "etc/os-release"), []byte("ID=kiln\n"), 0o644)
	sqfs := filepath.Join(t.TempDir(), "rootfs.img")
	testkit.Run(t, mksquashfs, src, sqfs, "-quiet", "-noappend")
	img, _ := os.ReadFile(sqfs)
	sum := sha256.Sum256(img)
	corrupt := bytes.Clone(img)
	corrupt[len(corrupt)/2] ^= 0x20

	for _, tt := range []struct {
		name    string
		serve   []byte
		fstype  string
		wantErr string
	}{
		{name: "verified image is mounted read-only", serve: img},
		{name: "a corrupt byte mounts nothing", serve: corrupt, wantErr: "sha256 mismatch"},
		{name: "a wrong rootfstype detaches the loop device", serve: img, fstype: "erofs", wantErr: "mount /dev/loop"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ram := t.TempDir()
			if err := unix.Mount("tmpfs", ram, "tmpfs", 0, "size=16m"); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { unix.Unmount(ram, unix.MNT_DETACH) })
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write(tt.serve) }))
			defer srv.Close()
			target := filepath.Join(t.TempDir(), "sysroot")
			live := liveRoot{url: srv.URL + "/rootfs.img", sha256: hex.EncodeToString(sum[:])}
			dev, _, err := mountLiveRoot(t.Context(), slog.New(slog.DiscardHandler), liveroot.Fetcher{Dir: ram}, liveroot.Medium{}, live, tt.fstype, nil, target)
			if err == nil {
				t.Cleanup(func() { unix.Unmount(target, 0); liveroot.Detach(dev) })
			}
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("mountLiveRoot = %v, want %q", err, tt.wantErr)
				}
				if mp, _ := isMountPoint(target); mp {
					t.Error("something is mounted on the target")
				}
				if devs := attachedTo(t, ram); len(devs) > 0 {
					t.Errorf("loop devices still attached to the image: %v", devs)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got, _ := os.ReadFile(filepath.Join(target, "etc/os-release")); string(got) != "ID=kiln\n" {
				t.Errorf("os-release = %q", got)
			}
			if err := os.WriteFile(filepath.Join(target, "x"), nil, 0o644); err == nil {
				t.Error("the live root is writable")
			}
			if devs := attachedTo(t, ram); len(devs) != 1 || "/dev/"+devs[0] != dev {
				t.Errorf("loop devices on the image: %v, want %s", devs, dev)
			}
		})
	}
}
