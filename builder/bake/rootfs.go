package bake

import (
	"os"
	"path/filepath"
	"time"

	"github.com/kilnproject/kiln/builder/disk"
	"github.com/kilnproject/kiln/builder/rootfs"
)

// makeRootFS writes the tree as the definition's root filesystem in the work directory, with
// the owners the tree records (a pseudo file), and returns its path.
func (b *baker) makeRootFS(tree *rootfs.Tree) (string, error) {
	t := time.Now()
	pseudo := filepath.Join(b.work, "owners.pseudo")
	pf, err := os.Create(pseudo)
	if err != nil {
		return "", err
	}
	err = tree.PseudoFile(pf)
	if cerr := pf.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", err
	}
	img := filepath.Join(b.work, "root."+b.def.Disk.RootFS)
	err = disk.MakeRootFS(b.ctx, tree.Dir, img, disk.RootFSOptions{
		Type: b.def.Disk.RootFS, Compression: b.def.Disk.Compression, PseudoFile: pseudo,
		SourceDateEpoch: b.o.Created.Unix(), Logger: b.log,
	})
	if err != nil {
		return "", err
	}
	b.step("root filesystem made", t)
	return img, nil
}
