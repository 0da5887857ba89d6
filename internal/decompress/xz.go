package decompress

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"hash/crc64"
	"io"

	"github.com/ulikunitz/xz/lzma"
)

// The .xz container (tukaani.org/xz/xz-file-format.txt) is read here, not by
// github.com/ulikunitz/xz's Reader: that one allocates whatever dictionary a block header asks
// for, up to 4 GiB, and has no way to refuse it, so a file of a few hundred KiB can make it fill
// a gigabyte of memory. xzReader refuses a block whose dictionary is over its bound before
// allocating it, and decodes each block's LZMA2 data with lzma.Reader2 and a dictionary of the
// size the header declares. It checks what the format lets it check: the CRC32 of headers,
// index and footer, each block's check (CRC32, CRC64, SHA-256) and sizes, and the index
// against the blocks read.

// ErrMemoryLimit is wrapped by the error of a stream that needs more memory than
// Options.MaxMemory allows.
var ErrMemoryLimit = errors.New("over the decoder's memory bound")

var (
	xzMagic       = []byte("\xfd7zXZ\x00")
	xzFooterMagic = []byte("YZ")
	crc64Table    = crc64.MakeTable(crc64.ECMA)
)

// lzma2Filter is the filter ID of LZMA2, the only filter xzReader decodes.
const lzma2Filter = 0x21

// xzReader decodes an xz file: one or more streams, each of blocks, an index and a footer.
type xzReader struct {
	r       *countingReader
	maxDict int64  // 0: no bound but the format's
	flags   []byte // the current stream's flags; nil between streams
	streams int
	blocks  int
	records []xzRecord // the current stream's blocks, for its index
	block   *xzBlock   // the block being read; nil between blocks
	err     error
}

// xzRecord is what the index says of a block.
type xzRecord struct{ unpadded, uncompressed int64 }

type xzBlock struct {
	dec          *lzma.Reader2
	headerLen    int64
	start        int64 // the reader's count where the block's data starts
	csize, usize int64 // as the header declares them, -1 when it does not
	n            int64 // bytes decoded so far
	check        hash.Hash
}

// newXzReader reads the first stream header of r; the blocks are read as the caller reads.
func newXzReader(r io.Reader, maxDict int64) (*xzReader, error) {
	br, ok := r.(byteReader)
	if !ok {
		br = bufio.NewReader(r)
	}
	x := &xzReader{r: &countingReader{r: br}, maxDict: maxDict}
	if err := x.streamHeader(); err != nil {
		return nil, err
	}
	return x, nil
}

func (x *xzReader) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	for x.err == nil {
		if x.block == nil {
			x.err = x.next()
			continue
		}
		n, err := x.block.read(p)
		switch {
		case err == io.EOF:
			err = x.endBlock()
		case err != nil:
			err = fmt.Errorf("xz: block %d: %w", x.blocks, unexpected(err))
		}
		if err != nil {
			x.err = err
			return n, err
		}
		if n > 0 {
			return n, nil
		}
	}
	return 0, x.err
}

// next reads what comes after a block, or after a stream's footer: a block header, an index
// and footer, or the next stream's header (io.EOF when the file ends instead).
func (x *xzReader) next() error {
	if x.flags == nil {
		return x.streamHeader()
	}
	size, err := x.r.ReadByte()
	if err != nil {
		return fmt.Errorf("xz: block %d: %w", x.blocks+1, unexpected(err))
	}
	if size == 0 {
		return x.indexAndFooter()
	}
	return x.blockHeader(size)
}

// streamHeader reads a stream header, after the stream padding (groups of four zero bytes)
// that may follow a stream; io.EOF when the file ends after a stream.
func (x *xzReader) streamHeader() error {
	h := make([]byte, 12)
	for {
		if _, err := io.ReadFull(x.r, h[:4]); err != nil {
			if err == io.EOF && x.streams > 0 {
				return io.EOF
			}
			return fmt.Errorf("xz: stream header: %w", unexpected(err))
		}
		if x.streams == 0 || !allZero(h[:4]) {
			break
		}
	}
	if _, err := io.ReadFull(x.r, h[4:]); err != nil {
		return fmt.Errorf("xz: stream header: %w", unexpected(err))
	}
	if !bytes.Equal(h[:6], xzMagic) {
		return errors.New("xz: not an xz stream")
	}
	if crc32.ChecksumIEEE(h[6:8]) != binary.LittleEndian.Uint32(h[8:]) || h[6] != 0 {
		return errors.New("xz: corrupt stream header")
	}
	if _, err := newCheck(h[7]); err != nil {
		return err
	}
	x.flags, x.records = h[6:8], nil
	x.streams++
	return nil
}

// blockHeader reads the header of a block whose first byte is size, refuses a dictionary over
// the bound and starts the block's decoder.
func (x *xzReader) blockHeader(size byte) error {
	x.blocks++
	h := make([]byte, (int(size)+1)*4)
	h[0] = size
	if _, err := io.ReadFull(x.r, h[1:]); err != nil {
		return fmt.Errorf("xz: block %d: header: %w", x.blocks, unexpected(err))
	}
	end := len(h) - 4
	if crc32.ChecksumIEEE(h[:end]) != binary.LittleEndian.Uint32(h[end:]) {
		return fmt.Errorf("xz: block %d: corrupt header", x.blocks)
	}
	b := &xzBlock{headerLen: int64(len(h)), csize: -1, usize: -1}
	dict, err := b.parseHeader(h[1], bytes.NewReader(h[2:end]))
	if err != nil {
		return fmt.Errorf("xz: block %d: %w", x.blocks, err)
	}
	if x.maxDict > 0 && dict > x.maxDict {
		return fmt.Errorf("xz: block %d needs a %s dictionary (%w of %s)", x.blocks, byteSize(dict), ErrMemoryLimit, byteSize(x.maxDict))
	}
	b.check, _ = newCheck(x.flags[1])
	b.start = x.r.n
	// NewReader2 allocates exactly DictCap bytes (and reads the first chunk's header).
	if b.dec, err = (lzma.Reader2Config{DictCap: int(max(dict, lzma.MinDictCap))}).NewReader2(x.r); err != nil {
		return fmt.Errorf("xz: block %d: %w", x.blocks, err)
	}
	x.block = b
	return nil
}

// parseHeader reads a block header's fields after its flags and returns the dictionary size
// its one filter, LZMA2, declares.
func (b *xzBlock) parseHeader(flags byte, r *bytes.Reader) (int64, error) {
	var err error
	switch {
	case flags&0x3c != 0:
		return 0, errors.New("reserved header flags set")
	case flags&0x03 != 0:
		return 0, errors.New("filters besides LZMA2 (BCJ, delta) are not supported")
	}
	if flags&0x40 != 0 {
		if b.csize, err = readVarint(r); err != nil {
			return 0, err
		}
	}
	if flags&0x80 != 0 {
		if b.usize, err = readVarint(r); err != nil {
			return 0, err
		}
	}
	id, err := readVarint(r)
	if err != nil {
		return 0, err
	}
	n, err := readVarint(r)
	if err != nil {
		return 0, err
	}
	props, err := r.ReadByte()
	switch {
	case id != lzma2Filter:
		return 0, fmt.Errorf("filter %#x is not supported (LZMA2 is)", id)
	case n != 1 || err != nil || props > 40:
		return 0, errors.New("corrupt LZMA2 properties")
	}
	for r.Len() > 0 {
		if c, _ := r.ReadByte(); c != 0 {
			return 0, errors.New("corrupt header padding")
		}
	}
	if props == 40 {
		return 1<<32 - 1, nil
	}
	return int64(2|props&1) << (props/2 + 11), nil
}

func (b *xzBlock) read(p []byte) (int, error) {
	n, err := b.dec.Read(p)
	b.n += int64(n)
	if b.check != nil {
		b.check.Write(p[:n])
	}
	if b.usize >= 0 && b.n > b.usize {
		return n, errors.New("more data than its header says")
	}
	return n, err
}

// endBlock checks the block just decoded: its sizes, padding and check.
func (x *xzReader) endBlock() error {
	b := x.block
	x.block = nil
	csize := x.r.n - b.start
	if b.csize >= 0 && csize != b.csize || b.usize >= 0 && b.n != b.usize {
		return fmt.Errorf("xz: block %d: sizes differ from its header", x.blocks)
	}
	sum := checkSum(b.check)
	tail := make([]byte, (4-(b.headerLen+csize)%4)%4+int64(len(sum)))
	if _, err := io.ReadFull(x.r, tail); err != nil {
		return fmt.Errorf("xz: block %d: %w", x.blocks, unexpected(err))
	}
	pad := len(tail) - len(sum)
	if !allZero(tail[:pad]) || !bytes.Equal(tail[pad:], sum) {
		return fmt.Errorf("xz: block %d: check failed", x.blocks)
	}
	x.records = append(x.records, xzRecord{b.headerLen + csize + int64(len(sum)), b.n})
	return nil
}

// indexAndFooter reads a stream's index (its indicator byte read already) and footer, and
// checks them against the blocks read.
func (x *xzReader) indexAndFooter() error {
	start := x.r.n - 1
	crc := crc32.NewIEEE()
	crc.Write([]byte{0})
	r := hashingByteReader{x.r, crc}
	if err := x.index(r); err != nil {
		return fmt.Errorf("xz: index: %w", err)
	}
	tail := make([]byte, (4-(x.r.n-start)%4)%4+4)
	if _, err := io.ReadFull(x.r, tail); err != nil {
		return fmt.Errorf("xz: index: %w", unexpected(err))
	}
	crc.Write(tail[:len(tail)-4])
	if !allZero(tail[:len(tail)-4]) || crc.Sum32() != binary.LittleEndian.Uint32(tail[len(tail)-4:]) {
		return errors.New("xz: corrupt index")
	}
	f := make([]byte, 12)
	if _, err := io.ReadFull(x.r, f); err != nil {
		return fmt.Errorf("xz: stream footer: %w", unexpected(err))
	}
	if crc32.ChecksumIEEE(f[4:10]) != binary.LittleEndian.Uint32(f) || !bytes.Equal(f[8:10], x.flags) ||
		!bytes.Equal(f[10:], xzFooterMagic) || (int64(binary.LittleEndian.Uint32(f[4:8]))+1)*4 != x.r.n-12-start {
		return errors.New("xz: corrupt stream footer")
	}
	x.flags = nil
	return nil
}

// index reads an index's records (after its indicator) from r and checks them against the
// blocks read.
func (x *xzReader) index(r io.ByteReader) error {
	count, err := readVarint(r)
	if err != nil {
		return err
	}
	if count != int64(len(x.records)) {
		return fmt.Errorf("it lists %d blocks, the stream has %d", count, len(x.records))
	}
	for i, rec := range x.records {
		unpadded, err := readVarint(r)
		if err != nil {
			return err
		}
		uncompressed, err := readVarint(r)
		if err != nil {
			return err
		}
		if (xzRecord{unpadded, uncompressed}) != rec {
			return fmt.Errorf("block %d differs from what it lists", i+1)
		}
	}
	return nil
}

// newCheck returns the hash of a check type (nil for none).
func newCheck(id byte) (hash.Hash, error) {
	switch id {
	case 0x00:
		return nil, nil
	case 0x01:
		return crc32.NewIEEE(), nil
	case 0x04:
		return crc64.New(crc64Table), nil
	case 0x0a:
		return sha256.New(), nil
	}
	return nil, fmt.Errorf("xz: check type %#x is not supported (none, CRC32, CRC64 and SHA-256 are)", id)
}

// checkSum is a block's check as the file stores it: CRCs little-endian.
func checkSum(h hash.Hash) []byte {
	switch h := h.(type) {
	case nil:
		return nil
	case hash.Hash32:
		return binary.LittleEndian.AppendUint32(nil, h.Sum32())
	case hash.Hash64:
		return binary.LittleEndian.AppendUint64(nil, h.Sum64())
	}
	return h.Sum(nil)
}

// readVarint reads one of the format's integers: up to 9 bytes, 7 bits each, least
// significant first.
func readVarint(r io.ByteReader) (int64, error) {
	var v int64
	for i := range 9 {
		c, err := r.ReadByte()
		if err != nil {
			return 0, unexpected(err)
		}
		v |= int64(c&0x7f) << (7 * i)
		if c&0x80 == 0 {
			if c == 0 && i > 0 {
				break
			}
			return v, nil
		}
	}
	return 0, errors.New("corrupt integer")
}

func unexpected(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

func allZero(b []byte) bool { return len(bytes.Trim(b, "\x00")) == 0 }

// byteSize renders a dictionary size: "1024 MiB", "64 KiB".
func byteSize(n int64) string {
	if n >= 1<<20 {
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprintf("%d KiB", n>>10)
}

type byteReader interface {
	io.Reader
	io.ByteReader
}

// countingReader counts the bytes read through it.
type countingReader struct {
	r byteReader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

func (c *countingReader) ReadByte() (byte, error) {
	b, err := c.r.ReadByte()
	if err == nil {
		c.n++
	}
	return b, err
}

// hashingByteReader writes each byte it reads into h.
type hashingByteReader struct {
	r io.ByteReader
	h hash.Hash
}

func (r hashingByteReader) ReadByte() (byte, error) {
	b, err := r.r.ReadByte()
	if err == nil {
		r.h.Write([]byte{b})
	}
	return b, err
}
