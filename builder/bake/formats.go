package bake

import (
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/kilnproject/kiln/builder/output"
)

// convert turns the raw disk into each of the definition's formats, in its order, and returns
// the files: raw itself where the definition lists raw, pxeDir and isoFile (written before)
// where it lists pxe and iso. Without raw in the list, the raw disk is removed once converted.
func (b *baker) convert(raw, pxeDir, isoFile string, sums *hashes) ([]string, error) {
	files := []string{}
	for _, f := range b.def.Formats {
		switch f {
		case "raw":
			files = append(files, raw)
			continue
		case "pxe":
			files = append(files, pxeDir)
			continue
		case "iso":
			files = append(files, isoFile)
			continue
		}
		t := time.Now()
		format, err := output.Lookup(f)
		if err != nil {
			return nil, err
		}
		dst := filepath.Join(b.work, b.stem+format.Suffix)
		if err := output.Convert(b.ctx, raw, f, dst); err != nil {
			return nil, err
		}
		files = append(files, dst)
		sums.start(dst)
		b.step("converted to "+f, t)
	}
	if !slices.Contains(b.def.Formats, "raw") {
		os.Remove(raw)
	}
	return files, nil
}
