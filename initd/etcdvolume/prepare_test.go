package etcdvolume

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/kilnproject/kiln/internal/testkit"
)

// disk stands for the disk's path in the commands of madeBy.
const disk = "<disk>"

// madeBy returns a setup that makes a sparse disk of mib MiB and runs each command on it,
// its path in place of disk.
func madeBy(mib int64, cmds ...[]string) func(t *testing.T) string {
	return func(t *testing.T) string {
		dev := testkit.SparseFile(t, mib<<20)
		for _, c := range cmds {
			args := slices.Clone(c[1:])
			for i := range args {
				if args[i] == disk {
					args[i] = dev
				}
			}
			testkit.Run(t, c[0], args...)
		}
		return dev
	}
}

// blkidOf is what blkid reports about dev, as KEY=VALUE lines ("" when blank).
func blkidOf(t *testing.T, dev string) map[string]string {
	t.Helper()
	out, err := exec.Command("blkid", "-p", "-o", "export", dev).Output()
	var exit *exec.ExitError
	if errors.As(err, &exit) && exit.ExitCode() == 2 {
		return map[string]string{}
	}
	if err != nil {
		t.Fatalf("blkid %s: %v", dev, err)
	}
	m := map[string]string{}
	for _, line := range strings.Split(string(out), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			m[k] = v
		}
	}
	return m
}

// ext4WithData makes an ext4 filesystem labelled label holding /member/db with
// content, as etcd would have left it.
func ext4WithData(t *testing.T, label, content string) string {
	dev := testkit.SparseFile(t, 64<<20)
	src := t.TempDir()
	if err := os.MkdirAll(filepath.Join(src, "member"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "member", "db"), []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	testkit.Run(t, "mkfs.ext4", "-q", "-F", "-L", label, "-d", src, dev)
	return dev
}

// catExt4 reads a file out of an ext4 image without mounting it.
func catExt4(t *testing.T, dev, p string) string {
	t.Helper()
	out, err := exec.Command("debugfs", "-R", "cat "+p, dev).Output()
	if err != nil {
		t.Fatalf("debugfs cat %s: %v", p, err)
	}
	return string(out)
}

const etcdData = "etcd bolt database: member b, revision 4711\n"

const fixedUUID = "0b6e3f5c-1a2b-4c3d-8e9f-a0b1c2d3e4f5"

// prepareCase is a device as a setup leaves it and what Prepare must do with it.
type prepareCase struct {
	name  string
	setup func(t *testing.T) string
	want  Want
	// refused: the device must be refused and left byte for byte as it was, with an
	// error naming what was found.
	refused string
	// formatted: Prepare must report that it formatted.
	formatted bool
	wiped     bool
	// keepsData: the etcd data written by the setup must still be there.
	keepsData bool
	check     func(t *testing.T, dev string, res Result)
}

// prepareCases are the devices TestPrepare hands to Prepare.
var prepareCases = []prepareCase{
	{
		name:      "blank disk is formatted ext4 with the label",
		setup:     madeBy(64),
		want:      Want{FSType: "ext4", Label: "etcd"},
		formatted: true,
	},
	{
		name:      "default type is ext4",
		setup:     madeBy(64),
		want:      Want{Label: "etcd"},
		formatted: true,
	},
	{
		name:      "blank disk gets the wanted UUID",
		setup:     madeBy(64),
		want:      Want{FSType: "ext4", Label: "etcd", UUID: fixedUUID},
		formatted: true,
		check: func(t *testing.T, dev string, res Result) {
			if res.UUID != fixedUUID {
				t.Errorf("UUID = %s, want %s", res.UUID, fixedUUID)
			}
		},
	},
	{
		name:      "blank disk is formatted xfs when asked",
		setup:     madeBy(320),
		want:      Want{FSType: "xfs", Label: "etcd"},
		formatted: true,
	},
	{
		name:      "ext4 with etcd data is kept",
		setup:     func(t *testing.T) string { return ext4WithData(t, "etcd", etcdData) },
		want:      Want{FSType: "ext4", Label: "etcd"},
		keepsData: true,
	},
	{
		name:      "ext4 with data and no label wanted is kept",
		setup:     func(t *testing.T) string { return ext4WithData(t, "anything", etcdData) },
		want:      Want{FSType: "ext4"},
		keepsData: true,
	},
	{
		name:      "wipe keeps a disk that already carries the wanted filesystem",
		setup:     func(t *testing.T) string { return ext4WithData(t, "etcd", etcdData) },
		want:      Want{FSType: "ext4", Label: "etcd", Wipe: true},
		keepsData: true,
	},
	{
		name: "ext4 that was not cleanly unmounted is checked and kept",
		setup: func(t *testing.T) string {
			dev := ext4WithData(t, "etcd", etcdData)
			testkit.Run(t, "debugfs", "-w", "-R", "ssv state 0", dev) // "not clean"
			return dev
		},
		want:      Want{FSType: "ext4", Label: "etcd"},
		keepsData: true,
		check: func(t *testing.T, dev string, res Result) {
			if out := testkit.Run(t, "dumpe2fs", "-h", dev); !strings.Contains(out, "Filesystem state:         clean") {
				t.Errorf("e2fsck did not run: state is not clean:\n%s", out)
			}
		},
	},
	{
		name:    "xfs when ext4 is wanted is refused",
		setup:   madeBy(320, []string{"mkfs.xfs", "-q", "-L", "etcd", disk}),
		want:    Want{FSType: "ext4", Label: "etcd"},
		refused: "has an xfs filesystem (label \"etcd\", UUID ",
	},
	{
		name:    "partitioned disk is refused",
		setup:   madeBy(64, []string{"sgdisk", "-n", "1:0:0", "-t", "1:8300", disk}),
		want:    Want{FSType: "ext4", Label: "etcd"},
		refused: "has a partition table (gpt); refusing to format it",
	},
	{
		name:    "partitioned disk whose partition holds a filesystem is refused",
		setup:   madeBy(64, []string{"sgdisk", "-n", "1:0:0", disk}, []string{"mkfs.ext4", "-q", "-F", "-E", "offset=1048576", "-L", "etcd", disk, "16M"}),
		want:    Want{FSType: "ext4", Label: "etcd"},
		refused: "partition table (gpt)",
	},
	{
		name:    "ext4 with another label is refused",
		setup:   func(t *testing.T) string { return ext4WithData(t, "data", etcdData) },
		want:    Want{FSType: "ext4", Label: "etcd"},
		refused: `has an ext4 filesystem (label "data", UUID `,
	},
	{
		name:    "ext4 with another UUID is refused",
		setup:   func(t *testing.T) string { return ext4WithData(t, "etcd", etcdData) },
		want:    Want{FSType: "ext4", Label: "etcd", UUID: fixedUUID},
		refused: "not UUID " + fixedUUID,
	},
	{
		name:    "ext3 when ext4 is wanted is refused",
		setup:   madeBy(64, []string{"mkfs.ext3", "-q", "-F", "-L", "etcd", disk}),
		want:    Want{FSType: "ext4", Label: "etcd"},
		refused: "has an ext3 filesystem",
	},
	{
		name:      "wipe erases a partition table and formats",
		setup:     madeBy(64, []string{"sgdisk", "-n", "1:0:0", disk}),
		want:      Want{FSType: "ext4", Label: "etcd", Wipe: true},
		formatted: true,
		wiped:     true,
		check: func(t *testing.T, dev string, res Result) {
			if pt := blkidOf(t, dev)["PTTYPE"]; pt != "" {
				t.Errorf("partition table %s survived the wipe", pt)
			}
		},
	},
	{
		name:      "wipe erases xfs and formats ext4",
		setup:     madeBy(320, []string{"mkfs.xfs", "-q", "-L", "old", disk}),
		want:      Want{FSType: "ext4", Label: "etcd", Wipe: true},
		formatted: true,
		wiped:     true,
	},
	{
		name:      "wipe erases ext4 with another label and formats it again",
		setup:     func(t *testing.T) string { return ext4WithData(t, "data", etcdData) },
		want:      Want{FSType: "ext4", Label: "etcd", Wipe: true},
		formatted: true,
		wiped:     true,
		check: func(t *testing.T, dev string, res Result) {
			if out, err := exec.Command("debugfs", "-R", "cat /member/db", dev).CombinedOutput(); strings.Contains(string(out), etcdData) {
				t.Errorf("old data still readable after wipe and format (%v)", err)
			}
		},
	},
	{
		name:      "xfs whose mkfs was interrupted is formatted again",
		setup:     madeBy(320, []string{"mkfs.xfs", "-q", "-L", "etcd", disk}, []string{"xfs_db", "-x", "-c", "sb 0", "-c", "write inprogress 1", disk}),
		want:      Want{FSType: "xfs", Label: "etcd"},
		formatted: true,
		check: func(t *testing.T, dev string, res Result) {
			if out := testkit.Run(t, "xfs_db", "-c", "sb 0", "-c", "p inprogress", dev); !strings.Contains(out, "inprogress = 0") {
				t.Errorf("after Prepare: %s", out)
			}
		},
	},
	{
		name:    "interrupted xfs mkfs with another label is refused",
		setup:   madeBy(320, []string{"mkfs.xfs", "-q", "-L", "other", disk}, []string{"xfs_db", "-x", "-c", "sb 0", "-c", "write inprogress 1", disk}),
		want:    Want{FSType: "xfs", Label: "etcd"},
		refused: `not labelled "etcd"`,
	},
}

func TestPrepare(t *testing.T) {
	testkit.Tools(t, "blkid", "mkfs.ext4", "mkfs.xfs", "e2fsck", "wipefs", "sgdisk", "debugfs", "xfs_db")
	for _, tt := range prepareCases {
		t.Run(tt.name, func(t *testing.T) { checkPrepare(t, tt) })
	}
}

// checkPrepare runs Prepare on the device tt sets up, twice (the second boot), and checks
// what it did.
func checkPrepare(t *testing.T, tt prepareCase) {
	ctx := context.Background()
	dev := tt.setup(t)
	before := testkit.FileSHA256(t, dev)
	res, err := Prepare(ctx, dev, tt.want)
	if tt.refused != "" {
		var refused *refusedError
		if !errors.As(err, &refused) || !errors.Is(err, errRefused) {
			t.Fatalf("Prepare = %+v, %v; want a *RefusedError", res, err)
		}
		if !strings.Contains(err.Error(), tt.refused) || !strings.Contains(err.Error(), dev) {
			t.Errorf("error %q does not name the device and %q", err, tt.refused)
		}
		if after := testkit.FileSHA256(t, dev); after != before {
			t.Errorf("a refused device was modified")
		}
		return
	}
	if err != nil {
		t.Fatalf("Prepare: %v", err)
	}
	wantType := tt.want.FSType
	if wantType == "" {
		wantType = "ext4"
	}
	if res.Formatted != tt.formatted || res.Wiped != tt.wiped {
		t.Errorf("Formatted, Wiped = %v, %v; want %v, %v", res.Formatted, res.Wiped, tt.formatted, tt.wiped)
	}
	got := blkidOf(t, dev)
	if got["TYPE"] != wantType || res.FSType != wantType {
		t.Errorf("device has TYPE %q, Result.FSType %q; want %s", got["TYPE"], res.FSType, wantType)
	}
	if tt.want.Label != "" && (got["LABEL"] != tt.want.Label || res.Label != tt.want.Label) {
		t.Errorf("device has LABEL %q, Result.Label %q; want %q", got["LABEL"], res.Label, tt.want.Label)
	}
	if got["UUID"] != res.UUID || res.UUID == "" {
		t.Errorf("Result.UUID %q, device has %q", res.UUID, got["UUID"])
	}
	if tt.keepsData {
		if data := catExt4(t, dev, "/member/db"); data != etcdData {
			t.Errorf("etcd data after Prepare = %q, want %q", data, etcdData)
		}
	}
	if tt.check != nil {
		tt.check(t, dev, res)
	}

	// Running again (the next boot) keeps what is there.
	again, err := Prepare(ctx, dev, tt.want)
	if err != nil {
		t.Fatalf("second Prepare: %v", err)
	}
	if again.Formatted || again.Wiped || again.UUID != res.UUID {
		t.Errorf("second Prepare = %+v; want the filesystem kept (UUID %s)", again, res.UUID)
	}
}

func TestPrepareKeepsDataWrittenAfterFormat(t *testing.T) {
	testkit.Tools(t, "blkid", "mkfs.ext4", "e2fsck", "debugfs")
	ctx := context.Background()
	dev := testkit.SparseFile(t, 64<<20)
	want := Want{FSType: "ext4", Label: "etcd"}
	if res, err := Prepare(ctx, dev, want); err != nil || !res.Formatted {
		t.Fatalf("first Prepare = %+v, %v; want formatted", res, err)
	}
	src := filepath.Join(t.TempDir(), "db")
	if err := os.WriteFile(src, []byte(etcdData), 0o600); err != nil {
		t.Fatal(err)
	}
	testkit.Run(t, "debugfs", "-w", "-R", "write "+src+" db", dev)
	for boot := 2; boot <= 3; boot++ {
		res, err := Prepare(ctx, dev, want)
		if err != nil || res.Formatted {
			t.Fatalf("boot %d: Prepare = %+v, %v; want kept", boot, res, err)
		}
		if got := catExt4(t, dev, "/db"); got != etcdData {
			t.Fatalf("boot %d: data = %q", boot, got)
		}
	}
}

func TestPrepareCorruptExt4IsNotFormatted(t *testing.T) {
	testkit.Tools(t, "blkid", "mkfs.ext4", "e2fsck", "debugfs")
	dev := ext4WithData(t, "etcd", etcdData)
	uuid := blkidOf(t, dev)["UUID"]
	testkit.Run(t, "debugfs", "-w", "-R", "clri <2>", dev)    // destroy the root directory's inode
	testkit.Run(t, "debugfs", "-w", "-R", "ssv state 0", dev) // as after a crash: e2fsck -p checks it
	res, err := Prepare(context.Background(), dev, Want{FSType: "ext4", Label: "etcd"})
	if err == nil || errors.Is(err, errRefused) {
		t.Fatalf("Prepare = %+v, %v; want a filesystem check error", res, err)
	}
	if !strings.Contains(err.Error(), "e2fsck -f "+dev) {
		t.Errorf("error %q does not say how to repair", err)
	}
	if got := blkidOf(t, dev); got["TYPE"] != "ext4" || got["UUID"] != uuid {
		t.Errorf("device now has %v; want the damaged ext4 %s left in place", got, uuid)
	}
}

// TestPrepareAfterInterruptedMkfs kills mkfs at several points (strace fault
// injection: SIGKILL on the Nth write, the writes after it never happen) and checks
// that Prepare then finishes the job.
func TestPrepareAfterInterruptedMkfs(t *testing.T) {
	testkit.Tools(t, "strace", "blkid", "mkfs.ext4", "mkfs.xfs", "e2fsck")
	ctx := context.Background()
	for _, tc := range []struct {
		fstype string
		mib    int64
		mkfs   []string
		writes []int
	}{
		{"ext4", 64, []string{"mkfs.ext4", "-q", "-F", "-m0", "-L", "etcd"}, []int{1, 3, 50, 150, 250, 280}},
		{"xfs", 320, []string{"mkfs.xfs", "-q", "-L", "etcd"}, []int{1, 3, 10, 30, 60}},
	} {
		// The last write: for mkfs.ext4 the primary superblock.
		writes := append(tc.writes, countWrites(t, append(tc.mkfs, testkit.SparseFile(t, tc.mib<<20))))
		for _, n := range writes {
			t.Run(tc.fstype+"/killed at write "+strconv.Itoa(n), func(t *testing.T) {
				dev := testkit.SparseFile(t, tc.mib<<20)
				args := append([]string{"-f", "-o", "/dev/null", "-e", "trace=pwrite64,pwritev,write",
					"-e", "inject=pwrite64,pwritev:signal=KILL:when=" + strconv.Itoa(n)}, tc.mkfs...)
				if out, err := exec.Command("strace", append(args, dev)...).CombinedOutput(); err == nil {
					t.Fatalf("mkfs finished before write %d: %s", n, out)
				}
				t.Logf("after the interrupted mkfs blkid reports %v", blkidOf(t, dev))
				res, err := Prepare(ctx, dev, Want{FSType: tc.fstype, Label: "etcd"})
				if err != nil {
					t.Fatalf("Prepare: %v", err)
				}
				if !res.Formatted {
					t.Errorf("Prepare kept the half-made filesystem: %+v", res)
				}
				if got := blkidOf(t, dev); got["TYPE"] != tc.fstype || got["LABEL"] != "etcd" {
					t.Errorf("device has %v", got)
				}
				if tc.fstype == "xfs" {
					testkit.Run(t, "xfs_repair", "-n", dev) // a complete filesystem passes
				} else {
					testkit.Run(t, "e2fsck", "-fn", dev)
				}
			})
		}
	}
}

// countWrites runs cmd under strace and returns how many pwrite64/pwritev calls it made.
func countWrites(t *testing.T, cmd []string) int {
	t.Helper()
	out := filepath.Join(t.TempDir(), "trace")
	testkit.Run(t, "strace", append([]string{"-f", "-o", out, "-e", "trace=pwrite64,pwritev"}, cmd...)...)
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	n := strings.Count(string(data), "pwrite64(") + strings.Count(string(data), "pwritev(")
	if n == 0 {
		t.Fatalf("%s made no pwrite64/pwritev calls", cmd[0])
	}
	return n
}

func TestPrepareBadInput(t *testing.T) {
	if _, err := Prepare(context.Background(), testkit.SparseFile(t, 1<<20), Want{FSType: "btrfs"}); err == nil || !strings.Contains(err.Error(), `"btrfs" is not supported`) {
		t.Errorf("Prepare btrfs: %v", err)
	}
	if _, err := Prepare(context.Background(), "/nonexistent/disk", Want{}); err == nil || !strings.Contains(err.Error(), "/nonexistent/disk") {
		t.Errorf("Prepare of a missing device: %v", err)
	}
}

// TestPrepareMinSize: a disk smaller than Want.MinSize is refused, whatever it holds, with an
// error naming the device, its size and the minimum, and is left as it was; a disk of exactly
// the minimum is used.
func TestPrepareMinSize(t *testing.T) {
	testkit.Tools(t, "blkid", "mkfs.ext4", "e2fsck", "debugfs")
	ctx := context.Background()
	for _, tc := range []struct {
		name    string
		setup   func(t *testing.T) string
		min     int64
		wantErr []string // all in the error; none: formatted or kept
	}{
		{name: "blank, 1 GiB of 2 GiB", setup: madeBy(1024), min: 2 << 30,
			wantErr: []string{"holds 1 GiB (1073741824 bytes), less than the minimum of 2 GiB (2147483648 bytes)"}},
		{name: "blank, 1.5 GiB of 2 GiB", setup: madeBy(1536), min: 2 << 30,
			wantErr: []string{"holds 1.5 GiB (1610612736 bytes), less than the minimum of 2 GiB"}},
		{name: "etcd data on 64 MiB of 100 MiB", setup: func(t *testing.T) string { return ext4WithData(t, "etcd", etcdData) }, min: 100 << 20,
			wantErr: []string{"holds 64 MiB (67108864 bytes), less than the minimum of 100 MiB (104857600 bytes)"}},
		{name: "exactly the minimum", setup: madeBy(64), min: 64 << 20},
		{name: "no minimum", setup: madeBy(64)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dev := tc.setup(t)
			// A blank sparse disk stays without a written block; one with data stays byte for byte.
			unchanged := func() bool { return allocated(t, dev) == 0 }
			if allocated(t, dev) != 0 {
				before := testkit.FileSHA256(t, dev)
				unchanged = func() bool { return testkit.FileSHA256(t, dev) == before }
			}
			sig := blkidOf(t, dev)
			res, err := Prepare(ctx, dev, Want{FSType: "ext4", Label: "etcd", MinSize: tc.min})
			if tc.wantErr == nil {
				if err != nil || !res.Formatted {
					t.Fatalf("Prepare = %+v, %v; want formatted", res, err)
				}
				return
			}
			var tooSmall *tooSmallError
			if !errors.As(err, &tooSmall) || !errors.Is(err, ErrTooSmall) || tooSmall.Device != dev {
				t.Fatalf("Prepare = %+v, %v; want a *TooSmallError for %s", res, err, dev)
			}
			for _, w := range append(tc.wantErr, dev) {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			if !unchanged() || !reflect.DeepEqual(blkidOf(t, dev), sig) {
				t.Error("the refused device was changed")
			}
		})
	}
}

// allocated is how many bytes of p are allocated on disk (0 for a sparse file never written).
func allocated(t *testing.T, p string) int64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}
