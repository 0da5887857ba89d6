package stage1

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"

	"github.com/kilnproject/kiln/initd/stage1/devmapper"
	"github.com/kilnproject/kiln/internal/nodeimage"
	"github.com/kilnproject/kiln/internal/verity"
)

// verityName is the device-mapper name of the verified root.
const verityName = "kiln-root"

// verityArgs are kiln.verity.roothash= and kiln.verity.hashoffset=: the root image's dm-verity
// root hash and the byte offset of its verity superblock. A bake writes both on every boot
// entry and in the pxe output's kernel arguments.
type verityArgs struct {
	rootHash   []byte
	hashOffset int64
}

// parseVerity checks kiln.verity.*: both keys or neither, a 64-digit hash, an offset that is a
// whole number of 4096-byte blocks.
func (c *Cmdline) parseVerity() error {
	for k := range c.Kiln {
		if strings.HasPrefix(k, "verity.") && k != nodeimage.VerityRootHashKey && k != nodeimage.VerityHashOffsetKey {
			return fmt.Errorf("kernel cmdline: kiln.%s is not a verity parameter (want kiln.%s=, kiln.%s=)", k,
				nodeimage.VerityRootHashKey, nodeimage.VerityHashOffsetKey)
		}
	}
	h, hasHash := c.Kiln[nodeimage.VerityRootHashKey]
	o, hasOff := c.Kiln[nodeimage.VerityHashOffsetKey]
	if !hasHash && !hasOff {
		return nil
	}
	if !hasHash || !hasOff {
		return fmt.Errorf("kernel cmdline: kiln.%s= and kiln.%s= go together", nodeimage.VerityRootHashKey, nodeimage.VerityHashOffsetKey)
	}
	root, err := verity.ParseRootHash(h)
	if err != nil {
		return fmt.Errorf("kernel cmdline: kiln.%s=%s: %w", nodeimage.VerityRootHashKey, h, err)
	}
	off, err := strconv.ParseInt(o, 10, 64)
	if err != nil || off <= 0 || off%verity.BlockSize != 0 {
		return fmt.Errorf("kernel cmdline: kiln.%s=%s: want a positive multiple of %d bytes", nodeimage.VerityHashOffsetKey, o, verity.BlockSize)
	}
	c.verity = &verityArgs{rootHash: root, hashOffset: off}
	return nil
}

// openVerity reads the verity superblock of dev (what names the root in messages) at
// v.hashOffset and maps dev through dm-verity with v's root hash, through the control node c;
// it returns the verified device's node.
func openVerity(log *slog.Logger, c *devmapper.Control, what, dev string, v verityArgs) (devmapper.VerityDevice, error) {
	f, err := os.Open(dev)
	if err != nil {
		return devmapper.VerityDevice{}, err
	}
	p, err := verity.ReadSuperblock(f, v.hashOffset)
	f.Close()
	if err != nil {
		return devmapper.VerityDevice{}, fmt.Errorf("%s %s: %w: the root image is not the one this boot entry was baked with", what, dev, err)
	}
	p.RootHash = v.rootHash
	vd, err := c.OpenVerity(verityName, dev, p)
	if err != nil {
		return devmapper.VerityDevice{}, fmt.Errorf("%s %s: %w", what, dev, err)
	}
	log.Info("root verified by dm-verity", "root", what, "device", dev, "verity", vd.Path, "root_hash", p.RootHashHex(),
		"data_blocks", p.DataBlocks)
	return vd, nil
}

// mountVerified mounts the root on dev read-only at target through dm-verity when v is set
// (the bake's images always set it), directly otherwise. It returns the device mounted. When the
// mount fails and dm-verity saw a block that does not match, the error says the root was changed
// after the bake, naming it (what), dev and the root hash; the verity device is removed again.
func mountVerified(log *slog.Logger, what, dev, target, fstype string, v *verityArgs) (string, error) {
	if v == nil {
		log.Warn("the root is not verified: the kernel command line has no kiln.verity.roothash= (an image baked before kiln wrote verity trees)",
			"root", what, "device", dev)
		return dev, mountRootAt(log, dev, target, fstype)
	}
	c, err := devmapper.Open(devmapper.ControlPath)
	if err != nil {
		return "", err
	}
	defer c.Close()
	vd, err := openVerity(log, c, what, dev, *v)
	if err != nil {
		return "", err
	}
	err = mountRootAt(log, vd.Path, target, fstype)
	if err == nil {
		return vd.Path, nil
	}
	if bad, serr := c.Corrupted(verityName); serr == nil && bad {
		err = fmt.Errorf("%s %s does not match its root hash %x: a block of the root image was changed after the bake, so it is not mounted (%w)",
			what, dev, v.rootHash, err)
	}
	if rerr := c.Remove(verityName); rerr != nil {
		err = errors.Join(err, rerr)
	}
	return "", err
}

// hex is the root hash in hex, "" for no verity.
func (v *verityArgs) hex() string {
	if v == nil {
		return ""
	}
	return fmt.Sprintf("%x", v.rootHash)
}

// verifiedDev is the verity device mounted over dev, "" when the root was mounted directly.
func verifiedDev(mounted, dev string) string {
	if mounted == dev {
		return ""
	}
	return mounted
}
