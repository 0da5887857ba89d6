// Package verity computes, reads and checks dm-verity hash trees in the on-disk format of
// veritysetup (format 1, SHA-256, 4096-byte blocks): a filesystem image followed by a verity
// superblock and the hash tree, so one file is both the root image and what proves it.
//
// The bake appends the tree to the root image (Append), the kernel command line carries the
// root hash and the superblock's offset, stage 1 reads the superblock (ReadSuperblock) and hands
// the parameters to the kernel's dm-verity target, and `kiln inspect` checks every block
// (Check). The bytes are those `veritysetup format --hash-offset=N` writes for the same salt and
// UUID, so veritysetup can check a kiln image and the other way round.
package verity

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"runtime"
	"strings"

	"golang.org/x/sync/errgroup"
)

const (
	// BlockSize is the data and hash block size.
	BlockSize = 4096
	// Algorithm is the hash algorithm, as the kernel's table names it.
	Algorithm = "sha256"
	// SaltSize is the salt length Append uses.
	SaltSize = 32

	digestSize    = sha256.Size
	hashesPerBlk  = BlockSize / digestSize // 128
	superblockLen = 512
	maxSalt       = 256
	signature     = "verity\x00\x00"
	formatVersion = 1 // the salt goes before the block, not after (version 0)
)

// Params are a hash tree's parameters: what the kernel's dm-verity table and a check need.
type Params struct {
	// DataBlocks is the number of BlockSize blocks of data the tree covers.
	DataBlocks uint64
	// HashOffset is the byte offset of the superblock; the tree starts one block after it.
	HashOffset int64
	Salt       []byte
	UUID       [16]byte
	// RootHash is the digest of the top hash block; it is not in the superblock.
	RootHash []byte
}

// DataSize is the bytes the tree covers.
func (p Params) DataSize() int64 { return int64(p.DataBlocks) * BlockSize }

// HashStartBlock is the tree's first block, counted in BlockSize blocks from the device's start
// (the kernel's hash_start_block).
func (p Params) HashStartBlock() uint64 { return uint64(p.HashOffset)/BlockSize + 1 }

// End is the byte offset just past the tree.
func (p Params) End() int64 {
	n := int64(0)
	for _, c := range levelBlocks(p.DataBlocks) {
		n += int64(c)
	}
	return p.HashOffset + BlockSize + n*BlockSize
}

// Table is the dm-verity target's parameter string for data and hash on the same device dev.
func (p Params) Table(dev string) string {
	return fmt.Sprintf("1 %s %s %d %d %d %d %s %x %s", dev, dev, BlockSize, BlockSize, p.DataBlocks,
		p.HashStartBlock(), Algorithm, p.RootHash, saltHex(p.Salt))
}

func saltHex(s []byte) string {
	if len(s) == 0 {
		return "-"
	}
	return hex.EncodeToString(s)
}

// RootHashHex is the root hash in hex, as the kernel command line carries it.
func (p Params) RootHashHex() string { return hex.EncodeToString(p.RootHash) }

// levelBlocks returns the number of hash blocks of each level, the level over the data first
// (index 0) and the top level, of one block, last; none when the data is one block, whose
// digest is the root hash itself (the kernel's rule: levels while (blocks-1) >> (7*levels) != 0).
func levelBlocks(dataBlocks uint64) []uint64 {
	var out []uint64
	for n := dataBlocks; n > 1; {
		n = (n + hashesPerBlk - 1) / hashesPerBlk
		out = append(out, n)
	}
	return out
}

// levelOffsets returns each level's byte offset: the top level comes first on disk.
func levelOffsets(p Params) []int64 {
	counts := levelBlocks(p.DataBlocks)
	offs := make([]int64, len(counts))
	pos := p.HashOffset + BlockSize
	for i := len(counts) - 1; i >= 0; i-- {
		offs[i] = pos
		pos += int64(counts[i]) * BlockSize
	}
	return offs
}

// hashBlock is sha256(salt || block), format 1's digest.
func hashBlock(salt, block []byte) []byte {
	return appendHash(nil, sha256.New(), salt, block)
}

// appendHash appends block's digest (hashBlock) to out, with h, reset first.
func appendHash(out []byte, h hash.Hash, salt, block []byte) []byte {
	h.Reset()
	h.Write(salt)
	h.Write(block)
	return h.Sum(out)
}

// Append pads the image at path with zeros to a whole number of blocks and writes the
// superblock and the hash tree after it, salted with salt (at most 256 bytes; Append derives
// the superblock's UUID from it, so the same image and salt give the same bytes). It returns the
// parameters; the file grows by about 1/127 of its size plus two blocks.
func Append(path string, salt []byte) (Params, error) {
	if len(salt) > maxSalt {
		return Params{}, fmt.Errorf("verity salt of %d bytes: at most %d", len(salt), maxSalt)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return Params{}, err
	}
	p, err := appendTree(f, salt)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return Params{}, fmt.Errorf("verity tree for %s: %w", path, err)
	}
	return p, nil
}

func appendTree(f *os.File, salt []byte) (Params, error) {
	fi, err := f.Stat()
	if err != nil {
		return Params{}, err
	}
	if fi.Size() == 0 {
		return Params{}, errors.New("the image is empty")
	}
	size := (fi.Size() + BlockSize - 1) / BlockSize * BlockSize
	if err := f.Truncate(size); err != nil {
		return Params{}, err
	}
	p := Params{DataBlocks: uint64(size / BlockSize), HashOffset: size, Salt: append([]byte(nil), salt...)}
	u := sha256.Sum256(append([]byte("kiln verity uuid\x00"), salt...))
	copy(p.UUID[:], u[:16])
	p.UUID[6] = p.UUID[6]&0x0f | 0x40 // a version 4 UUID, as veritysetup makes
	p.UUID[8] = p.UUID[8]&0x3f | 0x80
	offs := levelOffsets(p)
	// Level by level: read the blocks below, write their digests packed into blocks.
	src, srcBlocks := int64(0), p.DataBlocks
	for lvl := range offs {
		if err := hashLevel(f, src, srcBlocks, offs[lvl], p.Salt); err != nil {
			return Params{}, err
		}
		src, srcBlocks = offs[lvl], (srcBlocks+hashesPerBlk-1)/hashesPerBlk
	}
	// The root hash is the digest of the one block left: the top hash block, or the data's
	// only block.
	top := make([]byte, BlockSize)
	if _, err := f.ReadAt(top, src); err != nil {
		return Params{}, err
	}
	p.RootHash = hashBlock(p.Salt, top)
	if _, err := f.WriteAt(p.superblock(), p.HashOffset); err != nil {
		return Params{}, err
	}
	if err := f.Truncate(p.End()); err != nil { // the last hash blocks' zero padding
		return Params{}, err
	}
	return p, nil
}

// hashLevel hashes n blocks at src and writes their digests, packed and the last block
// zero-padded, at dst. The level is cut into one run per processor, each a whole number of
// hash blocks, so that the runs write disjoint blocks and the bytes are those of one run.
func hashLevel(f *os.File, src int64, n uint64, dst int64, salt []byte) error {
	outBlocks := (n + hashesPerBlk - 1) / hashesPerBlk
	runs := min(uint64(runtime.GOMAXPROCS(0)), outBlocks)
	per := (outBlocks + runs - 1) / runs
	var g errgroup.Group
	for first := uint64(0); first < outBlocks; first += per {
		in := first * hashesPerBlk
		k := min((first+per)*hashesPerBlk, n) - in
		g.Go(func() error {
			return hashRun(f, src+int64(in)*BlockSize, in, k, dst+int64(first)*BlockSize, salt)
		})
	}
	return g.Wait()
}

// hashRun hashes the n blocks at src (block number first of its level) and writes their
// digests, packed and the last block zero-padded, at dst.
func hashRun(f *os.File, src int64, first, n uint64, dst int64, salt []byte) error {
	const batch = 256 // blocks read at a time
	in := make([]byte, batch*BlockSize)
	out := make([]byte, 0, BlockSize)
	h := sha256.New()
	pos := dst
	for i := uint64(0); i < n; {
		k := min(uint64(batch), n-i)
		buf := in[:k*BlockSize]
		if _, err := f.ReadAt(buf, src+int64(i)*BlockSize); err != nil {
			return fmt.Errorf("read block %d: %w", first+i, err)
		}
		for j := uint64(0); j < k; j++ {
			out = appendHash(out, h, salt, buf[j*BlockSize:(j+1)*BlockSize])
			if len(out) == BlockSize {
				if _, err := f.WriteAt(out, pos); err != nil {
					return err
				}
				pos += BlockSize
				out = out[:0]
			}
		}
		i += k
	}
	if len(out) > 0 {
		out = append(out, make([]byte, BlockSize-len(out))...)
		if _, err := f.WriteAt(out, pos); err != nil {
			return err
		}
	}
	return nil
}

// superblock is the 512-byte struct verity_sb.
func (p Params) superblock() []byte {
	b := make([]byte, superblockLen)
	copy(b[0:8], signature)
	binary.LittleEndian.PutUint32(b[8:], formatVersion)
	binary.LittleEndian.PutUint32(b[12:], 1) // hash_type 1: the normal format
	copy(b[16:32], p.UUID[:])
	copy(b[32:64], Algorithm)
	binary.LittleEndian.PutUint32(b[64:], BlockSize)
	binary.LittleEndian.PutUint32(b[68:], BlockSize)
	binary.LittleEndian.PutUint64(b[72:], p.DataBlocks)
	binary.LittleEndian.PutUint16(b[80:], uint16(len(p.Salt)))
	copy(b[88:88+maxSalt], p.Salt)
	return b
}

// Verify reads the superblock at hashOffset of r and checks every data and hash block against
// rootHash (hex), as a root must pass before it is trusted: at inspect, after an update's write.
// Once the superblock is read it returns its parameters (RootHash set), with a *CorruptError
// when a block does not match.
func Verify(r io.ReaderAt, hashOffset int64, rootHash string) (Params, error) {
	root, err := ParseRootHash(rootHash)
	if err != nil {
		return Params{}, err
	}
	p, err := ReadSuperblock(r, hashOffset)
	if err != nil {
		return Params{}, err
	}
	p.RootHash = root
	return p, Check(r, p)
}

// ReadSuperblock reads the superblock at offset off of r and returns its parameters, without
// RootHash. It refuses anything but format 1, SHA-256 and 4096-byte blocks, and a tree whose
// data would reach past off.
func ReadSuperblock(r io.ReaderAt, off int64) (Params, error) {
	b := make([]byte, superblockLen)
	if _, err := r.ReadAt(b, off); err != nil {
		return Params{}, fmt.Errorf("read verity superblock at byte %d: %w", off, err)
	}
	if string(b[0:8]) != signature {
		return Params{}, fmt.Errorf("no verity superblock at byte %d (signature %q)", off, bytes.TrimRight(b[0:8], "\x00"))
	}
	v, typ := binary.LittleEndian.Uint32(b[8:]), binary.LittleEndian.Uint32(b[12:])
	alg := string(bytes.TrimRight(b[32:64], "\x00"))
	dbs, hbs := binary.LittleEndian.Uint32(b[64:]), binary.LittleEndian.Uint32(b[68:])
	if v != 1 || typ != 1 || alg != Algorithm || dbs != BlockSize || hbs != BlockSize {
		return Params{}, fmt.Errorf("verity superblock at byte %d: version %d, hash type %d, %s, blocks %d/%d: only version 1, type 1, %s, %d-byte blocks are supported",
			off, v, typ, alg, dbs, hbs, Algorithm, BlockSize)
	}
	p := Params{DataBlocks: binary.LittleEndian.Uint64(b[72:]), HashOffset: off}
	copy(p.UUID[:], b[16:32])
	n := int(binary.LittleEndian.Uint16(b[80:]))
	if n > maxSalt {
		return Params{}, fmt.Errorf("verity superblock at byte %d: salt of %d bytes", off, n)
	}
	p.Salt = append([]byte(nil), b[88:88+n]...)
	if p.DataBlocks == 0 || p.DataSize() > off || off%BlockSize != 0 {
		return Params{}, fmt.Errorf("verity superblock at byte %d: %d data blocks do not end at or before it", off, p.DataBlocks)
	}
	return p, nil
}

// CorruptError is a block whose digest is not the one above it in the tree.
type CorruptError struct {
	// Level is -1 for a data block, else the hash level (0 over the data).
	Level int
	// Block is the block's index within its level (data: within the data).
	Block uint64
	// Offset is its byte offset in the device or file.
	Offset int64
}

func (e *CorruptError) Error() string {
	if e.Level < 0 {
		return fmt.Sprintf("data block %d (byte %d) does not match the verity tree", e.Block, e.Offset)
	}
	return fmt.Sprintf("hash block %d of level %d (byte %d) does not match the verity tree", e.Block, e.Level, e.Offset)
}

// Check reads every hash and data block of the tree p describes from r and returns a
// *CorruptError for the first block that does not hash to its parent's digest (the top block
// against p.RootHash), nil when all match.
func Check(r io.ReaderAt, p Params) error {
	if len(p.RootHash) != digestSize {
		return fmt.Errorf("root hash of %d bytes: want %d", len(p.RootHash), digestSize)
	}
	offs := levelOffsets(p)
	counts := levelBlocks(p.DataBlocks)
	blk := make([]byte, BlockSize)
	// want holds the digests expected for the current level's blocks, from the level above.
	want := p.RootHash
	for lvl := len(offs) - 1; lvl >= -1; lvl-- {
		off, n := int64(0), p.DataBlocks
		if lvl >= 0 {
			off, n = offs[lvl], counts[lvl]
		}
		var next []byte
		for i := uint64(0); i < n; i++ {
			at := off + int64(i)*BlockSize
			if _, err := r.ReadAt(blk, at); err != nil {
				return fmt.Errorf("read block at byte %d: %w", at, err)
			}
			if !bytes.Equal(hashBlock(p.Salt, blk), want[i*digestSize:(i+1)*digestSize]) {
				return &CorruptError{Level: lvl, Block: i, Offset: at}
			}
			if lvl >= 0 {
				next = append(next, blk...)
			}
		}
		want = next
	}
	return nil
}

// ParseRootHash reads a hex root hash.
func ParseRootHash(s string) ([]byte, error) {
	b, err := hex.DecodeString(strings.TrimSpace(s))
	if err != nil || len(b) != digestSize {
		return nil, fmt.Errorf("verity root hash %q: want %d hex digits", s, 2*digestSize)
	}
	return b, nil
}
