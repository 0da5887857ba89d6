package liveroot

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kilnproject/kiln/internal/nodeimage"
	"github.com/kilnproject/kiln/internal/testkit"
)

// isoImage writes an ISO 9660 image labelled label holding the file name with content, made
// by xorriso, and returns its path.
func isoImage(t *testing.T, label, name string, content []byte) string {
	t.Helper()
	testkit.Tool(t, "xorriso", "xorriso")
	tree := t.TempDir()
	p := filepath.Join(tree, filepath.FromSlash(name))
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, content, 0o644); err != nil {
		t.Fatal(err)
	}
	img := filepath.Join(t.TempDir(), label+".iso")
	testkit.Run(t, "xorriso", "-as", "mkisofs", "-quiet", "-R", "-V", label, "-o", img, tree)
	return img
}

// blockDevs makes a /sys/block and a /dev directory listing the devices: each name's node is
// a copy of the file it maps to, or absent when it maps to "".
func blockDevs(t *testing.T, devs map[string]string) (sysBlock, devDir string) {
	t.Helper()
	sysBlock, devDir = t.TempDir(), t.TempDir()
	for name, src := range devs {
		if err := os.Mkdir(filepath.Join(sysBlock, name), 0o755); err != nil {
			t.Fatal(err)
		}
		if src == "" {
			continue
		}
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(devDir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return sysBlock, devDir
}

func TestFindMedium(t *testing.T) {
	ours := isoImage(t, nodeimage.ISOLabel, "kiln/root.img", []byte("root"))
	other := isoImage(t, "CIDATA", "user-data", []byte("{}"))
	blank := filepath.Join(t.TempDir(), "blank")
	if err := os.WriteFile(blank, make([]byte, 64<<10), 0o644); err != nil {
		t.Fatal(err)
	}
	short := filepath.Join(t.TempDir(), "short")
	if err := os.WriteFile(short, []byte("tiny"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name       string
		devs       map[string]string
		want       string // device name found, "" for none
		wantLooked []string
	}{
		{"the CD among disks", map[string]string{"vda": blank, "sr0": ours, "sr1": ""}, "sr0", nil},
		{"another volume first", map[string]string{"sr0": other, "sr1": ours}, "sr1", []string{`sr0 (ISO 9660 "CIDATA")`}},
		{"a USB stick (sd*) with the hybrid image", map[string]string{"sda": ours, "vda": short}, "sda", nil},
		{"only another volume", map[string]string{"sr0": other, "vda": blank}, "", []string{`sr0 (ISO 9660 "CIDATA")`}},
		{"an empty drive", map[string]string{"sr0": ""}, "", nil},
		{"no block devices", map[string]string{}, "", nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			sysBlock, devDir := blockDevs(t, tt.devs)
			dev, looked, err := FindMedium(sysBlock, devDir, nodeimage.ISOLabel)
			if err != nil {
				t.Fatal(err)
			}
			want := ""
			if tt.want != "" {
				want = filepath.Join(devDir, tt.want)
			}
			if dev != want {
				t.Errorf("FindMedium = %q, want %q", dev, want)
			}
			if strings.Join(looked, "|") != strings.Join(tt.wantLooked, "|") {
				t.Errorf("looked at %q, want %q", looked, tt.wantLooked)
			}
		})
	}
	if _, _, err := FindMedium(filepath.Join(t.TempDir(), "missing"), "/dev", nodeimage.ISOLabel); err == nil || !strings.Contains(err.Error(), "list block devices") {
		t.Errorf("FindMedium without /sys/block = %v, want an error listing block devices", err)
	}
}

func TestMediumPath(t *testing.T) {
	for _, tt := range []struct {
		url, want string
		medium    bool
		wantErr   string
	}{
		{url: "medium:/kiln/root.img", want: "/kiln/root.img", medium: true},
		{url: "http://h/medium:/kiln/root.img"},
		{url: "medium:kiln/root.img", medium: true, wantErr: "not an absolute, clean path"},
		{url: "medium:/kiln/../etc/shadow", medium: true, wantErr: "not an absolute, clean path"},
		{url: "medium:/", medium: true, wantErr: "not an absolute, clean path"},
		{url: "medium:", medium: true, wantErr: "not an absolute, clean path"},
	} {
		t.Run(tt.url, func(t *testing.T) {
			got, medium, err := MediumPath(tt.url)
			if medium != tt.medium || got != tt.want {
				t.Errorf("MediumPath(%q) = %q, %v, want %q, %v", tt.url, got, medium, tt.want, tt.medium)
			}
			if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Errorf("MediumPath(%q) error = %v, want %q", tt.url, err, tt.wantErr)
			}
		})
	}
}

// TestCopyVerified copies the image from a directory as from the mounted medium: a match is
// kept read-only, a mismatch, a missing file and an image larger than the room leave nothing.
func TestCopyVerified(t *testing.T) {
	img, sum := image(300 << 10)
	medium := t.TempDir()
	if err := os.MkdirAll(filepath.Join(medium, "kiln"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(medium, "kiln", "root.img"), img, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name, file, want string
		room             int64
		wantErr          string
	}{
		{name: "match", file: "/kiln/root.img", want: sum, room: 1 << 20},
		{name: "mismatch", file: "/kiln/root.img", want: strings.Repeat("0", 64), room: 1 << 20, wantErr: "sha256 mismatch: the image has " + sum},
		{name: "missing", file: "/kiln/other.img", want: sum, room: 1 << 20, wantErr: "no such file"},
		{name: "a directory", file: "/kiln", want: sum, room: 1 << 20, wantErr: "is not a regular file"},
		{name: "too large", file: "/kiln/root.img", want: sum, room: 100 << 10, wantErr: "more than the 102400 bytes of RAM free"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := Fetcher{Dir: ramDir(t, 1<<20)}
			got, err := f.copyVerified(slog.New(slog.DiscardHandler), medium, tt.file, tt.want, tt.room)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("copyVerified = %v, want %q", err, tt.wantErr)
				}
				if _, err := os.Stat(filepath.Join(f.Dir, fileName)); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("%s left behind after the error (%v)", fileName, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			fi, err := os.Stat(got)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Size() != int64(len(img)) || fi.Mode().Perm() != 0o400 {
				t.Errorf("%s: %d bytes, mode %v; want %d bytes, 0400", got, fi.Size(), fi.Mode().Perm(), len(img))
			}
		})
	}
}

// TestFetchMediumWaitsThenGivesUp: with no volume of the label, FetchMedium waits out its
// Wait and names what it saw.
func TestFetchMediumWaitsThenGivesUp(t *testing.T) {
	other := isoImage(t, "CIDATA", "user-data", []byte("{}"))
	sysBlock, devDir := blockDevs(t, map[string]string{"sr0": other})
	f := Fetcher{Dir: ramDir(t, 1<<20)}
	m := Medium{Label: nodeimage.ISOLabel, SysBlock: sysBlock, DevDir: devDir, MountDir: filepath.Join(t.TempDir(), "m"), Wait: 600 * time.Millisecond}
	start := time.Now()
	_, err := f.FetchMedium(context.Background(), slog.New(slog.DiscardHandler), m, "/kiln/root.img", strings.Repeat("0", 64))
	if err == nil || !strings.Contains(err.Error(), `no block device holds the ISO 9660 volume labelled KILN_LIVE after 600ms (only sr0 (ISO 9660 "CIDATA")`) {
		t.Fatalf("FetchMedium = %v, want the volume not found, naming sr0", err)
	}
	if d := time.Since(start); d < 500*time.Millisecond {
		t.Errorf("gave up after %s, before its wait", d)
	}
}
