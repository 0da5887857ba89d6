// Package netboottest writes what a bake with the pxe and raw formats leaves in its output
// directory — <image>-<role>.json with its pxe object and outputs, the pxe directory and the
// raw image — with generated contents of chosen sizes, for kiln serve's tests and benchmark.
package netboottest

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"time"

	"github.com/kilnproject/kiln/internal/nodeimage"
)

// Sizes are the generated files' sizes in bytes.
type Sizes struct{ Kernel, Initrd, RootFS, Raw int64 }

// Small are sizes for tests: a few KiB each, distinct so a mix-up shows.
var Small = Sizes{Kernel: 3000, Initrd: 5000, RootFS: 7000, Raw: 9000}

// KernelArgs is the pxe object's kernel arguments in images written here.
const KernelArgs = "ro kiln.platform=metal console=ttyS0"

// WriteImage writes image name (<image>-<role>) into dir: the pxe files, the raw image and
// <name>.json recording their sha256. Contents are pseudo-random, seeded by name.
func WriteImage(dir, name string, s Sizes) (*nodeimage.Metadata, error) {
	pxeDir := name + nodeimage.PXEDirSuffix
	if err := os.MkdirAll(filepath.Join(dir, pxeDir), 0o755); err != nil {
		return nil, err
	}
	seed := sha256.Sum256([]byte(name))
	rng := rand.NewChaCha8(seed)
	pxe := &nodeimage.PXEInfo{Dir: pxeDir, KernelArgs: KernelArgs}
	md := &nodeimage.Metadata{Name: name, Role: "", Platform: "metal", Created: time.Unix(0, 0).UTC(), PXE: pxe}
	for _, f := range []struct {
		dst  *nodeimage.PXEFile
		name string
		size int64
	}{{&pxe.Kernel, nodeimage.PXEKernelName, s.Kernel}, {&pxe.Initrd, nodeimage.PXEInitrdName, s.Initrd},
		{&pxe.RootFS, nodeimage.PXERootFSName, s.RootFS}, {&pxe.Script, nodeimage.PXEScriptName, 64}} {
		sum, err := writeRandom(filepath.Join(dir, pxeDir, f.name), f.size, rng)
		if err != nil {
			return nil, err
		}
		*f.dst = nodeimage.PXEFile{File: f.name, SHA256: sum, Size: f.size}
		md.Outputs = append(md.Outputs, nodeimage.OutputInfo{Format: "pxe", File: pxeDir + "/" + f.name, Size: f.size, SHA256: sum})
	}
	raw := name + ".raw"
	sum, err := writeRandom(filepath.Join(dir, raw), s.Raw, rng)
	if err != nil {
		return nil, err
	}
	md.Outputs = append(md.Outputs, nodeimage.OutputInfo{Format: "raw", File: raw, Size: s.Raw, SHA256: sum})
	js, err := json.MarshalIndent(md, "", "  ")
	if err != nil {
		return nil, err
	}
	return md, os.WriteFile(filepath.Join(dir, name+".json"), js, 0o644)
}

// writeRandom writes size pseudo-random bytes to p and returns their hex sha256.
func writeRandom(p string, size int64, rng io.Reader) (string, error) {
	f, err := os.Create(p)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	if _, err := io.CopyN(io.MultiWriter(f, h), rng, size); err != nil {
		f.Close()
		return "", fmt.Errorf("write %s: %w", p, err)
	}
	if err := f.Close(); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
