package storage

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/kilnproject/kiln/internal/atomicfile"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

// state is nodeimage.StorageStatePath's contents: what Apply formatted itself, so that a later
// run keeps it even when the config says wipeVolume or wipeFilesystem (Ignition runs once,
// kiln's first boot may run again, and must never erase what it made).
type state struct {
	// Made maps an entry ("luks <name> <device>", "filesystem <device>") to the UUID of
	// what Apply formatted for it.
	Made map[string]string `json:"made"`
}

func loadState(root string) (*state, error) {
	st := &state{Made: map[string]string{}}
	data, err := os.ReadFile(filepath.Join(root, nodeimage.StorageStatePath))
	if errors.Is(err, fs.ErrNotExist) {
		return st, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", nodeimage.StorageStatePath, err)
	}
	if err := json.Unmarshal(data, st); err != nil {
		return nil, fmt.Errorf("%s: %w", nodeimage.StorageStatePath, err)
	}
	if st.Made == nil {
		st.Made = map[string]string{}
	}
	return st, nil
}

func (st *state) save(root string) error {
	data, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	if err := atomicfile.Write(filepath.Join(root, nodeimage.StorageStatePath), append(data, '\n'), atomicfile.Options{Mode: 0o644, DirMode: 0o755}); err != nil {
		return fmt.Errorf("record %s: %w", nodeimage.StorageStatePath, err)
	}
	return nil
}
