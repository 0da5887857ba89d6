package verity

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"

	"github.com/google/uuid"
)

// sizes cover no hash level (one block), one level (2…128 blocks), two and three levels, and an
// image that is no whole number of blocks.
var sizes = []struct {
	name string
	size int64
}{
	{"one block", BlockSize},
	{"part of a block", 100},
	{"128 blocks", 128 * BlockSize},
	{"129 blocks", 129 * BlockSize},
	{"three levels", (128*128 + 1) * BlockSize},
	{"uneven", 777*BlockSize + 1234},
}

func randomFile(t *testing.T, size int64) string {
	t.Helper()
	b := make([]byte, size)
	rand.Read(b)
	p := filepath.Join(t.TempDir(), "root.img")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestSameAsVeritysetup appends a tree with kiln and with veritysetup to the same image and
// wants the same bytes and root hash, and veritysetup's verify to accept kiln's.
func TestSameAsVeritysetup(t *testing.T) {
	tool, err := exec.LookPath("veritysetup")
	if err != nil {
		t.Fatal("veritysetup (Debian package cryptsetup-bin) is needed to check kiln's trees against it")
	}
	salt := bytes.Repeat([]byte{0xa5, 0x01}, SaltSize/2)
	for _, tc := range sizes {
		t.Run(tc.name, func(t *testing.T) {
			img := randomFile(t, tc.size)
			padded, err := os.ReadFile(img)
			if err != nil {
				t.Fatal(err)
			}
			padded = append(padded, make([]byte, (BlockSize-len(padded)%BlockSize)%BlockSize)...)
			p, err := Append(img, salt)
			if err != nil {
				t.Fatal(err)
			}
			if p.HashOffset != int64(len(padded)) || p.DataBlocks != uint64(len(padded)/BlockSize) {
				t.Fatalf("params %+v for %d padded bytes", p, len(padded))
			}
			theirs := filepath.Join(t.TempDir(), "theirs.img")
			if err := os.WriteFile(theirs, padded, 0o644); err != nil {
				t.Fatal(err)
			}
			out, err := exec.Command(tool, "format", "--hash-offset", fmt.Sprint(p.HashOffset),
				"--data-blocks", fmt.Sprint(p.DataBlocks), "--salt", saltHex(salt),
				"--uuid", uuid.UUID(p.UUID).String(), theirs, theirs).CombinedOutput()
			if err != nil {
				t.Fatalf("veritysetup format: %v\n%s", err, out)
			}
			m := regexp.MustCompile(`Root hash:\s+([0-9a-f]{64})`).FindSubmatch(out)
			if m == nil {
				t.Fatalf("no root hash in veritysetup's output:\n%s", out)
			}
			if got := p.RootHashHex(); got != string(m[1]) {
				t.Errorf("root hash %s, veritysetup's %s", got, m[1])
			}
			ours, _ := os.ReadFile(img)
			their, _ := os.ReadFile(theirs)
			if !bytes.Equal(ours, their) {
				t.Errorf("kiln's image (%d bytes) differs from veritysetup's (%d bytes) at byte %d", len(ours), len(their), firstDiff(ours, their))
			}
			if int64(len(ours)) != p.End() {
				t.Errorf("file is %d bytes, End() says %d", len(ours), p.End())
			}
			out, err = exec.Command(tool, "verify", "--hash-offset", fmt.Sprint(p.HashOffset), img, img, p.RootHashHex()).CombinedOutput()
			if err != nil {
				t.Errorf("veritysetup verify refuses kiln's tree: %v\n%s", err, out)
			}
		})
	}
}

// TestSameBytesOnAnyProcessors appends the tree with one, two and five processors: the levels
// are hashed in one run per processor, and the runs' cuts must not show in the bytes.
func TestSameBytesOnAnyProcessors(t *testing.T) {
	salt := bytes.Repeat([]byte{0x5a}, SaltSize)
	src := randomFile(t, (3*128*128+5)*BlockSize+17) // three levels, the first one of 385 blocks
	data, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	var first []byte
	for _, procs := range []int{1, 2, 5} {
		runtime.GOMAXPROCS(procs)
		img := filepath.Join(t.TempDir(), "root.img")
		if err := os.WriteFile(img, data, 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := Append(img, salt); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(img)
		if err != nil {
			t.Fatal(err)
		}
		if first == nil {
			first = got
		} else if !bytes.Equal(got, first) {
			t.Errorf("with %d processors the image (%d bytes) differs from one processor's (%d bytes) at byte %d", procs, len(got), len(first), firstDiff(got, first))
		}
	}
}

// BenchmarkAppend appends the tree to a 256 MiB image, the size of a worker's root.
func BenchmarkAppend(b *testing.B) {
	data := make([]byte, 256<<20)
	rand.Read(data)
	img := filepath.Join(b.TempDir(), "root.img")
	salt := bytes.Repeat([]byte{0x5a}, SaltSize)
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		b.StopTimer()
		if err := os.WriteFile(img, data, 0o644); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		if _, err := Append(img, salt); err != nil {
			b.Fatal(err)
		}
	}
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

func TestReadSuperblockAndCheck(t *testing.T) {
	for _, tc := range sizes {
		t.Run(tc.name, func(t *testing.T) {
			img := randomFile(t, tc.size)
			p, err := Append(img, []byte("salt"))
			if err != nil {
				t.Fatal(err)
			}
			f, err := os.Open(img)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			got, err := ReadSuperblock(f, p.HashOffset)
			if err != nil {
				t.Fatal(err)
			}
			got.RootHash = p.RootHash
			if got.Table("/dev/vda2") != p.Table("/dev/vda2") || got.UUID != p.UUID {
				t.Fatalf("superblock gives %+v, Append gave %+v", got, p)
			}
			if err := Check(f, got); err != nil {
				t.Fatalf("Check of an untouched image: %v", err)
			}
		})
	}
}

// TestCheckNamesTheChangedBlock flips one byte in a data block, a hash block and the top
// block, and wants Check to name each; a wrong root hash fails at the top.
func TestCheckNamesTheChangedBlock(t *testing.T) {
	const blocks = 128*3 + 5 // two levels: three full hash blocks and one more over the data
	img := randomFile(t, blocks*BlockSize)
	p, err := Append(img, []byte("salt"))
	if err != nil {
		t.Fatal(err)
	}
	offs := levelOffsets(p)
	cases := []struct {
		name  string
		at    int64
		level int
		block uint64
	}{
		{"data block 300", 300*BlockSize + 17, -1, 300},
		{"last data block", (blocks-1)*BlockSize + 4095, -1, blocks - 1},
		{"hash block 2 of level 0", offs[0] + 2*BlockSize + 9, 0, 2},
		{"zero padding of the last hash block", offs[0] + 3*BlockSize + 4000, 0, 3},
		{"top block", offs[1] + 1, 1, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b, _ := os.ReadFile(img)
			b[tc.at] ^= 0x40
			err := Check(bytes.NewReader(b), p)
			var ce *CorruptError
			if !errors.As(err, &ce) || ce.Level != tc.level || ce.Block != tc.block {
				t.Fatalf("Check = %v, want level %d block %d", err, tc.level, tc.block)
			}
			if !strings.Contains(err.Error(), fmt.Sprintf("byte %d", tc.at/BlockSize*BlockSize)) {
				t.Errorf("error %q does not name the block's offset", err)
			}
		})
	}
	wrong := p
	wrong.RootHash = bytes.Repeat([]byte{1}, 32)
	b, _ := os.ReadFile(img)
	var ce *CorruptError
	if err := Check(bytes.NewReader(b), wrong); !errors.As(err, &ce) || ce.Level != 1 {
		t.Errorf("Check with another root hash = %v, want the top block refused", err)
	}
}

func TestReadSuperblockRefuses(t *testing.T) {
	img := randomFile(t, 10*BlockSize)
	p, err := Append(img, nil)
	if err != nil {
		t.Fatal(err)
	}
	good, _ := os.ReadFile(img)
	cases := []struct {
		name   string
		change func(b []byte)
		off    int64
		want   string
	}{
		{"no superblock there", func([]byte) {}, 0, "no verity superblock at byte 0"},
		{"sha1", func(b []byte) { copy(b[p.HashOffset+32:], "sha1\x00\x00") }, p.HashOffset, "only version 1"},
		{"512-byte blocks", func(b []byte) { b[p.HashOffset+65] = 2 }, p.HashOffset, "only version 1"},
		{"data past the superblock", func(b []byte) { b[p.HashOffset+72] = 11 }, p.HashOffset, "11 data blocks do not end"},
		{"salt too long", func(b []byte) { b[p.HashOffset+81] = 2 }, p.HashOffset, "salt of 512 bytes"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := bytes.Clone(good)
			tc.change(b)
			_, err := ReadSuperblock(bytes.NewReader(b), tc.off)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("ReadSuperblock = %v, want %q", err, tc.want)
			}
		})
	}
}

func TestParseRootHash(t *testing.T) {
	if _, err := ParseRootHash(strings.Repeat("ab", 32)); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"", "abc", strings.Repeat("zz", 32), strings.Repeat("ab", 31)} {
		if _, err := ParseRootHash(bad); err == nil {
			t.Errorf("ParseRootHash(%q) accepted", bad)
		}
	}
}

// TestVerify: a root as Append left it verifies against its hex root hash; a flipped data byte
// and another root hash fail with a *CorruptError and the superblock's parameters; a malformed
// hash or a missing superblock fail before any block is read.
func TestVerify(t *testing.T) {
	img := randomFile(t, 40*BlockSize)
	p, err := Append(img, []byte("salt"))
	if err != nil {
		t.Fatal(err)
	}
	good, _ := os.ReadFile(img)
	flipped := bytes.Clone(good)
	flipped[5*BlockSize+3] ^= 1
	for _, tc := range []struct {
		name    string
		b       []byte
		off     int64
		hash    string
		corrupt bool
		ok      bool
	}{
		{"untouched", good, p.HashOffset, p.RootHashHex(), false, true},
		{"a data byte flipped", flipped, p.HashOffset, p.RootHashHex(), true, false},
		{"another root hash", good, p.HashOffset, strings.Repeat("01", 32), true, false},
		{"not a hash", good, p.HashOffset, "xyz", false, false},
		{"no superblock there", good, 0, p.RootHashHex(), false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Verify(bytes.NewReader(tc.b), tc.off, tc.hash)
			var ce *CorruptError
			switch {
			case tc.ok && err != nil:
				t.Fatalf("Verify: %v", err)
			case !tc.ok && err == nil:
				t.Fatal("Verify: no error")
			case tc.corrupt != errors.As(err, &ce):
				t.Fatalf("Verify = %v; a corrupt block: %v", err, tc.corrupt)
			case (tc.ok || tc.corrupt) && (got.DataBlocks != p.DataBlocks || got.HashOffset != p.HashOffset):
				t.Errorf("parameters %+v, want the superblock's (%d blocks at %d)", got, p.DataBlocks, p.HashOffset)
			}
		})
	}
}
