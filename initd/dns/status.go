package dns

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/kilnproject/kiln/internal/atomicfile"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

// StatusFile stores the registration State as JSON ({"state", "provider",
// "records", "last_error", "attempts", "updated"}) for `kiln-init status`, and gives
// the next boot the records this node published (for WithStale).
type StatusFile struct {
	// Root is the node's "/" ("" is "/"); Path is below it (nodeimage.DNSStatusPath when empty).
	Root, Path string
}

func (f StatusFile) file() string {
	p := f.Path
	if p == "" {
		p = nodeimage.DNSStatusPath
	}
	root := f.Root
	if root == "" {
		root = "/"
	}
	return filepath.Join(root, p)
}

// Write replaces the file with s atomically (mode 0644; missing directories are
// created 0755).
func (f StatusFile) Write(s State) error {
	data, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return fmt.Errorf("dns status: %w", err)
	}
	data = append(data, '\n')
	path := f.file()
	if err := atomicfile.Write(path, data, atomicfile.Options{Mode: 0o644, Chown: os.Geteuid() == 0, DirMode: 0o755}); err != nil {
		return fmt.Errorf("dns status: %w", err)
	}
	return nil
}

// Read returns the stored state; a missing file is an error wrapping fs.ErrNotExist.
func (f StatusFile) Read() (State, error) {
	var s State
	data, err := os.ReadFile(f.file())
	if err != nil {
		return s, fmt.Errorf("dns status: %w", err)
	}
	if err := json.Unmarshal(data, &s); err != nil {
		return s, fmt.Errorf("dns status %s: %w", f.file(), err)
	}
	return s, nil
}
