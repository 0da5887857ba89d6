package update

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/kilnproject/kiln/internal/atomicfile"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

// StatePath is the record of the last update, on the data partition: it survives the update
// and a rollback.
const StatePath = nodeimage.StateDir + "/update.json"

// State is the last update: what was written where, and how it ended.
type State struct {
	// Slot is the slot written, From the slot booted when it was written.
	Slot, From string
	Image      string    `json:",omitempty"`
	Kiln       string    `json:",omitempty"`
	Created    time.Time `json:",omitzero"`
	RootHash   string    `json:",omitempty"`
	Entry      string    `json:",omitempty"`
	Generation int       `json:",omitempty"`
	Written    time.Time `json:",omitzero"`
	Source     string    `json:",omitempty"`
	// Blessed is when the slot was found good.
	Blessed time.Time `json:",omitzero"`
	// LastFailure is why the last try of the slot was not good (a health check's answer).
	LastFailure string `json:",omitempty"`
	// RolledBack is set once the node booted the old slot again, with why.
	RolledBack *Rollback `json:",omitempty"`
}

// Rollback is when and why the node went back to the other slot.
type Rollback struct {
	At     time.Time
	To     string
	Reason string
}

// ReadState reads the record under root; os.ErrNotExist when no update was made.
func ReadState(root string) (*State, error) {
	b, err := os.ReadFile(filepath.Join(root, StatePath))
	if err != nil {
		return nil, err
	}
	var s State
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("%s: %w", StatePath, err)
	}
	return &s, nil
}

func (s *State) write(root string) error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(filepath.Join(root, StatePath), append(b, '\n'), atomicfile.Options{Mode: 0o644, DirMode: 0o755})
}

// SlotStatus is one slot as Read found it.
type SlotStatus struct {
	Slot
	Booted bool
	// Entry is its boot entry, nil when it has none (never written, or being written).
	Entry *Entry
	// Image names the image in the slot, from its metadata on the ESP.
	Image, Kiln string
	Created     time.Time
	RootHash    string
	Default     bool
}

// Status is the node's slots, which boots next, and the last update.
type Status struct {
	Slots []SlotStatus
	Last  *State
}

// Read reports the slots of disk (ESP mounted), the default entry and the last update's record
// under root.
func Read(disk Disk, root string) (Status, error) {
	entries, err := readEntries(disk.ESPDir)
	if err != nil {
		return Status{}, err
	}
	def, hasDef := Default(entries)
	var st Status
	for _, l := range []string{"a", "b"} {
		s := SlotStatus{Slot: disk.Slots[l], Booted: disk.Booted == l}
		for _, e := range entries {
			if e.Slot == l {
				s.Entry = &e
				s.Default = hasDef && def.File == e.File
				s.RootHash = e.RootHash()
			}
		}
		if md := slotImage(disk.ESPDir, l); md != nil {
			s.Image, s.Kiln, s.Created = md.Name+"-"+md.Role, md.Kiln, md.Created
		}
		st.Slots = append(st.Slots, s)
	}
	last, err := ReadState(root)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return Status{}, err
	}
	st.Last = last
	return st, nil
}

// slotImage reads the metadata of the image in a slot from the ESP: an update's copy, or for
// slot a the bake's.
func slotImage(esp, slot string) *nodeimage.Metadata {
	for _, p := range []string{slotImageJSON(slot), nodeimage.ESPImageJSONPath} {
		if p == nodeimage.ESPImageJSONPath && slot != "a" {
			break
		}
		b, err := os.ReadFile(espPath(esp, p))
		if err != nil {
			continue
		}
		var md nodeimage.Metadata
		if json.Unmarshal(b, &md) == nil {
			return &md
		}
	}
	return nil
}
