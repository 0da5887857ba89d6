package decompress

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/kilnproject/kiln/internal/testkit"
)

// xzFile compresses data with xz(1) at preset 1 (quick) and the given options.
func xzFile(t *testing.T, data []byte, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(testkit.Tool(t, "xz", "xz-utils"), append([]string{"-c", "-T1", "-1"}, args...)...)
	cmd.Stdin = bytes.NewReader(data)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("xz %s: %v", strings.Join(args, " "), err)
	}
	return out
}

// xzBlockSpan is where a block of an xz file starts and how long it is (header, data, padding
// and check), as xz --list says.
type xzBlockSpan struct{ off, size int }

// xzBlocks lists the blocks of an xz file, as xz --robot --list says.
func xzBlocks(t *testing.T, file []byte) []xzBlockSpan {
	t.Helper()
	p := filepath.Join(t.TempDir(), "f.xz")
	if err := os.WriteFile(p, file, 0o644); err != nil {
		t.Fatal(err)
	}
	out := testkit.Run(t, testkit.Tool(t, "xz", "xz-utils"), "--robot", "--list", "-v", p)
	var blocks []xzBlockSpan
	for line := range strings.Lines(out) {
		if f := strings.Split(line, "\t"); f[0] == "block" {
			off, err1 := strconv.Atoi(f[4])
			size, err2 := strconv.Atoi(f[6])
			if err1 != nil || err2 != nil {
				t.Fatalf("xz --list: %q", line)
			}
			blocks = append(blocks, xzBlockSpan{off, size})
		}
	}
	return blocks
}

// withDict returns file with the LZMA2 dictionary of the block whose header starts at off
// set to the property code (dictionary 2^(code/2+12) for an even code), and the header's CRC32
// made right again: what an attacker serves.
func withDict(t *testing.T, file []byte, off int, code byte) []byte {
	t.Helper()
	file = bytes.Clone(file)
	h := file[off : off+(int(file[off])+1)*4]
	r := bytes.NewReader(h[2:])
	skip := 2 // filter ID, properties size
	if h[1]&0x40 != 0 {
		skip++
	}
	if h[1]&0x80 != 0 {
		skip++
	}
	for range skip {
		if _, err := readVarint(r); err != nil {
			t.Fatal(err)
		}
	}
	h[len(h)-r.Len()] = code
	binary.LittleEndian.PutUint32(h[len(h)-4:], crc32.ChecksumIEEE(h[:len(h)-4]))
	return file
}

// xzTestData is 512 KiB that compresses a little, as a disk image does.
func xzTestData() []byte {
	var b bytes.Buffer
	for i := 0; b.Len() < 512<<10; i++ {
		b.WriteString(strconv.Itoa(i*7919%100003) + " kiln\n")
	}
	return b.Bytes()
}

// TestXzFromXzUtils: files xz(1) writes decode to what they hold, with every check type, in
// blocks (as xz -T writes them, sizes in the headers), several streams with stream padding.
func TestXzFromXzUtils(t *testing.T) {
	data := xzTestData()
	half := len(data) / 2
	tests := []struct {
		name string
		file func(t *testing.T) []byte
		want []byte
	}{
		{name: "crc64", file: func(t *testing.T) []byte { return xzFile(t, data) }, want: data},
		{name: "no check", file: func(t *testing.T) []byte { return xzFile(t, data, "--check=none") }, want: data},
		{name: "crc32", file: func(t *testing.T) []byte { return xzFile(t, data, "--check=crc32") }, want: data},
		{name: "sha256", file: func(t *testing.T) []byte { return xzFile(t, data, "--check=sha256") }, want: data},
		{name: "-6", file: func(t *testing.T) []byte { return xzFile(t, data, "-6") }, want: data},
		{name: "blocks", file: func(t *testing.T) []byte { return xzFile(t, data, "-T2", "--block-size=100KiB") }, want: data},
		{name: "incompressible", file: func(t *testing.T) []byte { return xzFile(t, random(100<<10)) }},
		{name: "empty", file: func(t *testing.T) []byte { return xzFile(t, nil) }, want: []byte{}},
		{name: "two streams and padding", file: func(t *testing.T) []byte {
			return bytes.Join([][]byte{xzFile(t, data[:half]), make([]byte, 8), xzFile(t, data[half:], "--check=crc32")}, nil)
		}, want: data},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			file := tt.file(t)
			want := tt.want
			if want == nil {
				want = unxz(t, file)
			}
			rc, err := Options{MaxMemory: 256 << 20}.Open(bytes.NewReader(file), Xz)
			if err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(rc)
			if err != nil || !bytes.Equal(got, want) {
				t.Fatalf("read %d bytes, %v; want the %d bytes xz compressed", len(got), err, len(want))
			}
		})
	}
}

func random(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

// unxz is what xz -d makes of file.
func unxz(t *testing.T, file []byte) []byte {
	t.Helper()
	cmd := exec.Command(testkit.Tool(t, "xz", "xz-utils"), "-dc")
	cmd.Stdin = bytes.NewReader(file)
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestXzMemoryBound: a file whose block header asks for a dictionary over the bound (its data
// a few KiB) is refused by a decoder bounded at 256 MiB, in the first block or a later one,
// before the dictionary is allocated; the error wraps ErrMemoryLimit and names the sizes. The
// same file is decoded where the bound allows its dictionary.
func TestXzMemoryBound(t *testing.T) {
	const bound = 256 << 20
	data := xzTestData()
	one := xzFile(t, data)
	multi := xzFile(t, data, "-T2", "--block-size=64KiB")
	blocks := xzBlocks(t, multi)
	if len(blocks) < 3 {
		t.Fatalf("xz made %d blocks, want several", len(blocks))
	}
	tests := []struct {
		name  string
		file  []byte
		bound int64
		want  string // "" when the file decodes
	}{
		{name: "1.5 GiB in the first block", file: withDict(t, one, 12, 37), bound: bound,
			want: "xz: block 1 needs a 1536 MiB dictionary (over the decoder's memory bound of 256 MiB)"},
		{name: "1 GiB in the third block", file: withDict(t, multi, blocks[2].off, 36), bound: bound,
			want: "xz: block 3 needs a 1024 MiB dictionary"},
		{name: "the largest the format has", file: withDict(t, one, 12, 40), bound: bound, want: "needs a 4095 MiB dictionary"},
		{name: "just over", file: withDict(t, one, 12, 32), bound: 256<<20 - 1, want: "needs a 256 MiB dictionary (over the decoder's memory bound of 255 MiB)"},
		{name: "at the bound", file: withDict(t, one, 12, 32), bound: bound},
		{name: "under the bound", file: withDict(t, one, 12, 30), bound: bound},
		{name: "no bound", file: withDict(t, one, 12, 30)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			var got []byte
			rc, err := Options{MaxMemory: tt.bound}.Open(bytes.NewReader(tt.file), Xz)
			if err == nil {
				got, err = io.ReadAll(rc)
			}
			runtime.ReadMemStats(&after)
			if tt.want == "" {
				if err != nil || !bytes.Equal(got, data) {
					t.Fatalf("read %d bytes, %v; want the %d bytes compressed", len(got), err, len(data))
				}
				return
			}
			if !errors.Is(err, ErrMemoryLimit) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("decoding = %v, want an error wrapping ErrMemoryLimit saying %q", err, tt.want)
			}
			if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 16<<20 {
				t.Errorf("the refused decode allocated %d MiB", alloc>>20)
			}
		})
	}
}

// TestXzRefusesDamage: a file damaged anywhere, or cut short, fails to decode rather than
// yielding wrong data: each CRC of the container and each kind of block check is verified.
func TestXzRefusesDamage(t *testing.T) {
	data := xzTestData()
	file := xzFile(t, data, "-T2", "--block-size=128KiB")
	blocks := xzBlocks(t, file)
	flip := func(file []byte, off int) []byte {
		b := bytes.Clone(file)
		b[off] ^= 0x01
		return b
	}
	// In incompressible data LZMA2 stores chunks as they are: only the check can tell a
	// flipped bit there.
	stored := random(64 << 10)
	type damage struct {
		name string
		file []byte
		want string // part of the error
	}
	tests := []damage{
		{name: "stream header", file: flip(file, 7), want: "xz: corrupt stream header"},
		{name: "not xz", file: flip(file, 1), want: "xz: not an xz stream"},
		{name: "block header", file: flip(file, blocks[1].off+2), want: "xz: block 2: corrupt header"},
		{name: "block data", file: flip(file, blocks[1].off+1000)},
		{name: "index", file: flip(file, len(file)-14), want: "xz: corrupt index"},
		{name: "footer", file: flip(file, len(file)-3), want: "xz: corrupt stream footer"},
		{name: "cut in the index", file: file[:len(file)-20], want: "xz: index: " + io.ErrUnexpectedEOF.Error()},
		{name: "cut in the footer", file: file[:len(file)-5], want: "xz: stream footer: " + io.ErrUnexpectedEOF.Error()},
		{name: "cut in a block", file: file[:blocks[2].off+500], want: "xz: block 3: " + io.ErrUnexpectedEOF.Error()},
		{name: "trailing garbage", file: append(bytes.Clone(file), "kiln kiln kiln"...), want: "xz: not an xz stream"},
		{name: "stream padding not of four bytes", file: append(bytes.Clone(file), 0, 0, 0), want: io.ErrUnexpectedEOF.Error()},
		{name: "a BCJ filter", file: xzFile(t, data, "--x86", "--lzma2"), want: "filters besides LZMA2"},
	}
	for _, check := range []string{"crc32", "crc64", "sha256"} {
		f := xzFile(t, stored, "--check="+check)
		b := xzBlocks(t, f)[0]
		tests = append(tests,
			damage{name: check + " of stored data", file: flip(f, b.off+b.size/2), want: "xz: block 1: check failed"},
			damage{name: check + " itself", file: flip(f, b.off+b.size-1), want: "xz: block 1: check failed"})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rc, err := Open(bytes.NewReader(tt.file), Xz)
			var got []byte
			if err == nil {
				got, err = io.ReadAll(rc)
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("decoded %d bytes (%v of the original), %v; want an error saying %q", len(got), bytes.Equal(got, data), err, tt.want)
			}
		})
	}
}
