package stage1

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/kilnproject/kiln/internal/atomicfile"
)

// BootInfoPath is where stage 1 records how it booted. /run moves into the new root, so the
// booted system reads it at the same path; it lasts until the next reboot.
const BootInfoPath = "/run/kiln/boot.json"

// BootInfo is how stage 1 booted the node: the mode, the root, and where /var is.
type BootInfo struct {
	Mode Mode `json:"mode"`
	// RootDevice is the device the root is mounted from: the root slot's partition or the loop device
	// of a live root.
	RootDevice string `json:"rootDevice"`
	// VerifiedDevice is the dm-verity device mounted over RootDevice and RootHash its root
	// hash; both empty when the root is not verified.
	VerifiedDevice string `json:"verifiedDevice,omitempty"`
	RootHash       string `json:"rootHash,omitempty"`
	// RootURL and RootSHA256 are a live root's source and digest.
	RootURL    string `json:"rootURL,omitempty"`
	RootSHA256 string `json:"rootSHA256,omitempty"`
	// VarDevice is the device /var is on, "tmpfs" when it is in RAM; VarKind (a varChoice kind,
	// or "data partition" on a disk boot) and VarWhy say why.
	VarDevice string `json:"varDevice"`
	VarKind   string `json:"varKind"`
	VarWhy    string `json:"varWhy,omitempty"`
	// Link and Address are the network stage 1 brought up (live boots).
	Link    string `json:"link,omitempty"`
	Address string `json:"address,omitempty"`
}

// varKindDisk is BootInfo.VarKind on a disk boot: the data partition beside the root slots.
const varKindDisk = "data partition"

// String renders the record as one line for kiln-init status.
func (b BootInfo) String() string {
	var s strings.Builder
	fmt.Fprintf(&s, "%s: root %s", b.Mode, b.RootDevice)
	if b.RootURL != "" {
		fmt.Fprintf(&s, " (%s, sha256 %s)", b.RootURL, b.RootSHA256)
	}
	if b.RootHash != "" {
		fmt.Fprintf(&s, " verified by dm-verity (%s, root hash %s)", b.VerifiedDevice, b.RootHash)
	} else {
		s.WriteString(" not verified")
	}
	fmt.Fprintf(&s, ", /var on %s (%s)", b.VarDevice, b.VarKind)
	if b.Link != "" {
		fmt.Fprintf(&s, ", network %s %s", b.Link, b.Address)
	}
	return s.String()
}

// writeBootInfo records b at root/BootInfoPath.
func writeBootInfo(root string, b BootInfo) error {
	data, err := json.MarshalIndent(b, "", "  ")
	if err != nil {
		return err
	}
	path := filepath.Join(root, BootInfoPath)
	if err := atomicfile.Write(path, append(data, '\n'), atomicfile.Options{Mode: 0o644, DirMode: 0o755}); err != nil {
		return fmt.Errorf("record the boot: %w", err)
	}
	return nil
}

// ReadBootInfo reads what stage 1 recorded at root/BootInfoPath.
func ReadBootInfo(root string) (BootInfo, error) {
	data, err := os.ReadFile(filepath.Join(root, BootInfoPath))
	if err != nil {
		return BootInfo{}, err
	}
	var b BootInfo
	if err := json.Unmarshal(data, &b); err != nil {
		return BootInfo{}, fmt.Errorf("%s: %w", filepath.Join(root, BootInfoPath), err)
	}
	return b, nil
}
