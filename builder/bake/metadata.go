package bake

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/kilnproject/kiln/builder/output"
	"github.com/kilnproject/kiln/builder/rootfs"
	"github.com/kilnproject/kiln/internal/atomicfile"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

// writeImageJSON writes md, as it stands once the tree is laid, to /etc/kiln/image.json in the
// tree and returns what it wrote.
func writeImageJSON(tree *rootfs.Tree, md *nodeimage.Metadata) ([]byte, error) {
	data, err := marshalMetadata(md)
	if err != nil {
		return nil, err
	}
	if err := tree.WriteFile(nodeimage.ImageJSONPath, bytes.NewReader(data), 0o644); err != nil {
		return nil, err
	}
	return data, nil
}

// writeMetadata records the output files in md and writes it, complete with the disk's layout,
// as <stem>.json in the work directory. It returns that file's path. The pxe directory has one
// entry per file, named <dir>/<file>.
func (b *baker) writeMetadata(files []string, md *nodeimage.Metadata, sums *hashes) (string, error) {
	defer b.step("outputs hashed", time.Now())
	for _, f := range files {
		if md.PXE != nil && filepath.Base(f) == md.PXE.Dir {
			for _, pf := range md.PXE.Files() {
				p := filepath.Join(f, pf.File)
				md.Outputs = append(md.Outputs, nodeimage.OutputInfo{Format: "pxe", File: md.PXE.Dir + "/" + pf.File,
					Size: pf.Size, Allocated: allocated(p), SHA256: pf.SHA256})
			}
			continue
		}
		sum, size, err := sums.get(f)
		if err != nil {
			return "", err
		}
		md.Outputs = append(md.Outputs, nodeimage.OutputInfo{Format: output.OfFile(f), File: filepath.Base(f), Size: size, Allocated: allocated(f), SHA256: sum})
	}
	data, err := marshalMetadata(md)
	if err != nil {
		return "", err
	}
	file := filepath.Join(b.work, b.stem+".json")
	if err := atomicfile.Write(file, data, atomicfile.Options{Mode: 0o644}); err != nil {
		return "", err
	}
	return file, nil
}

// marshalMetadata is md as indented JSON with a final newline.
func marshalMetadata(md *nodeimage.Metadata) ([]byte, error) {
	data, err := json.MarshalIndent(md, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(data, '\n'), nil
}

// fileSHA256 is the hex SHA-256 of the file p, "" if it cannot be read.
func fileSHA256(p string) string {
	sum, _, err := output.HashFile(p)
	if err != nil {
		return ""
	}
	return sum
}

// fileSize is the size of the file p, 0 if it cannot be stat'ed.
func fileSize(p string) int64 {
	fi, err := os.Stat(p)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// allocated is the space a (sparse) file really takes on disk.
func allocated(p string) int64 {
	var st syscall.Stat_t
	if err := syscall.Stat(p, &st); err != nil {
		return 0
	}
	return st.Blocks * 512
}
