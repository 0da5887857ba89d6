package bake

import (
	"crypto/sha256"
	"fmt"
	"strings"
	"time"

	"github.com/kilnproject/kiln/internal/nodeimage"
	"github.com/kilnproject/kiln/internal/verity"
)

// appendVerity appends the dm-verity hash tree to the root image rootImg and records it in md.
// The salt derives from the image's name and base digest, so the same inputs give the same
// bytes while images of other names or bases never share a salt.
func (b *baker) appendVerity(rootImg string, md *nodeimage.Metadata) error {
	t := time.Now()
	salt := sha256.Sum256([]byte("kiln verity salt\x00" + b.stem + "@" + md.Base.Digest))
	p, err := verity.Append(rootImg, salt[:])
	if err != nil {
		return err
	}
	md.Verity = &nodeimage.VerityInfo{RootHash: p.RootHashHex(), Salt: fmt.Sprintf("%x", p.Salt), Algorithm: verity.Algorithm,
		DataBlocks: p.DataBlocks, HashOffset: p.HashOffset, Size: p.End()}
	b.step("verity tree appended", t, "root_hash", md.Verity.RootHash, "tree_bytes", p.End()-p.HashOffset)
	return nil
}

// kernelArgs are the definition's kernel arguments and the verity ones, which every boot of
// the image (disk or network) carries.
func (b *baker) kernelArgs(md *nodeimage.Metadata) string {
	args := strings.Join(b.def.Kernel.Args, " ")
	if md.Verity != nil {
		args = strings.TrimSpace(fmt.Sprintf("%s kiln.%s=%s kiln.%s=%d", args, nodeimage.VerityRootHashKey, md.Verity.RootHash,
			nodeimage.VerityHashOffsetKey, md.Verity.HashOffset))
	}
	return args
}
