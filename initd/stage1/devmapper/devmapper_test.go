package devmapper

import (
	"encoding/binary"
	"strings"
	"testing"

	"github.com/kilnproject/kiln/internal/verity"
)

// TestIoctlNumbers holds the numbers to linux/dm-ioctl.h's (DM_DEV_CREATE is 0xc138fd03 on
// every Linux architecture with the generic ioctl layout).
func TestIoctlNumbers(t *testing.T) {
	for cmd, want := range map[uintptr]uintptr{
		cmdDevCreate: 0xc138fd03, cmdDevRemove: 0xc138fd04, cmdDevSuspend: 0xc138fd06,
		cmdTableLoad: 0xc138fd09, cmdTableStatus: 0xc138fd0c,
	} {
		if got := ioctlNumber(cmd); got != want {
			t.Errorf("ioctl %d = %#x, want %#x", cmd, got, want)
		}
	}
}

func TestTableLoadRequest(t *testing.T) {
	p := verity.Params{DataBlocks: 10, HashOffset: 10 * verity.BlockSize, Salt: []byte{1, 2}, RootHash: make([]byte, 32)}
	table := p.Table("/dev/vda2")
	if want := "1 /dev/vda2 /dev/vda2 4096 4096 10 11 sha256 " + strings.Repeat("00", 32) + " 0102"; table != want {
		t.Fatalf("table %q, want %q", table, want)
	}
	r, err := newRequest("kiln-root", flagReadOnly, targetSpec(p.DataSize()/512, "verity", table), 0)
	if err != nil {
		t.Fatal(err)
	}
	b := r.buf
	le := binary.LittleEndian
	if len(b)%8 != 0 || le.Uint32(b[12:]) != uint32(len(b)) || le.Uint32(b[16:]) != headerSize || le.Uint32(b[0:]) != 4 {
		t.Fatalf("header: version %d, data_size %d of %d, data_start %d", le.Uint32(b), le.Uint32(b[12:]), len(b), le.Uint32(b[16:]))
	}
	if le.Uint32(b[28:]) != flagReadOnly || string(b[48:57]) != "kiln-root" || b[57] != 0 {
		t.Fatalf("flags %d, name %q", le.Uint32(b[28:]), b[48:58])
	}
	spec := b[headerSize:]
	if le.Uint64(spec[8:]) != 80 || string(spec[24:30]) != "verity" || string(spec[specSize:specSize+len(table)]) != table || spec[specSize+len(table)] != 0 {
		t.Fatalf("target spec: %d sectors, type %q, params %q", le.Uint64(spec[8:]), spec[24:40], spec[specSize:])
	}
}

func TestNamesRefused(t *testing.T) {
	for _, name := range []string{"", "a/b", strings.Repeat("x", 128)} {
		if _, err := newRequest(name, 0, nil, 0); err == nil {
			t.Errorf("name %q accepted", name)
		}
	}
}
