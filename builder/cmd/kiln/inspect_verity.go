package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"

	"github.com/kilnproject/kiln/builder/disk"
	"github.com/kilnproject/kiln/internal/cmdline"
	"github.com/kilnproject/kiln/internal/nodeimage"
	"github.com/kilnproject/kiln/internal/verity"
)

// verityReport is what inspect found checking a disk's root against the root hash of its boot
// entry.
type verityReport struct {
	Partition  string `json:"partition"`
	RootHash   string `json:"rootHash"`
	HashOffset int64  `json:"hashOffset"`
	DataBlocks uint64 `json:"dataBlocks,omitempty"`
	TreeBytes  int64  `json:"treeBytes,omitempty"`
	OK         bool   `json:"ok"`
	Problem    string `json:"problem,omitempty"`
}

// checkVerity reads every block of the disk's root-a and checks it against the root hash the
// boot entry carries. It returns nil, nil for a disk whose entry has no kiln.verity.* (baked
// before kiln wrote verity trees); a report whose OK is false with an error naming the
// partition, the block and the root hash when a block does not match.
func checkVerity(image string, res *disk.Result) (*verityReport, error) {
	line := cmdline.Parse(res.Cmdline)
	hash, hasHash := line.Lookup("kiln." + nodeimage.VerityRootHashKey)
	off, hasOff := line.Lookup("kiln." + nodeimage.VerityHashOffsetKey)
	if !hasHash && !hasOff {
		return nil, nil
	}
	rep := &verityReport{Partition: nodeimage.RootAName, RootHash: hash}
	fail := func(err error) (*verityReport, error) {
		rep.Problem = err.Error()
		return rep, fmt.Errorf("%s: %s does not verify against the boot entry's root hash %s: %w", image, rep.Partition, hash, err)
	}
	var err error
	if rep.HashOffset, err = strconv.ParseInt(off, 10, 64); err != nil {
		return fail(fmt.Errorf("kiln.%s=%s: %w", nodeimage.VerityHashOffsetKey, off, err))
	}
	part, ok := res.Partition(nodeimage.RootAName)
	if !ok {
		return fail(errors.New("the disk has no such partition"))
	}
	f, err := os.Open(image)
	if err != nil {
		return fail(err)
	}
	defer f.Close()
	r := io.NewSectionReader(f, part.Start, part.Size)
	p, err := verity.Verify(r, rep.HashOffset, hash)
	if p.DataBlocks != 0 {
		rep.DataBlocks, rep.TreeBytes = p.DataBlocks, p.End()-p.HashOffset
	}
	if err != nil {
		var ce *verity.CorruptError
		if errors.As(err, &ce) {
			err = fmt.Errorf("%w (disk byte %d)", err, part.Start+ce.Offset)
		}
		return fail(err)
	}
	rep.OK = true
	return rep, nil
}

// printVerity writes one line on the check.
func printVerity(w io.Writer, rep *verityReport) {
	switch {
	case rep == nil:
		fmt.Fprintf(w, "verity:  none: the boot entry has no kiln.verity.roothash=, the root is not verified at boot\n")
	case rep.OK:
		fmt.Fprintf(w, "verity:  %s ok: every block matches root hash %s (%d data blocks, tree %d KiB at byte %d)\n",
			rep.Partition, rep.RootHash, rep.DataBlocks, rep.TreeBytes>>10, rep.HashOffset)
	default:
		fmt.Fprintf(w, "verity:  %s MISMATCH against root hash %s: %s\n", rep.Partition, rep.RootHash, rep.Problem)
	}
}
