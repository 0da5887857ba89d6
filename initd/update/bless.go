package update

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/kilnproject/kiln/internal/nodeimage"
)

// Health says whether the booted node is good; nil when it is. It is asked until it says so or
// the bound passes.
type Health func(ctx context.Context) error

// BootOutcome is what BootCheck found and did.
type BootOutcome struct {
	// Trial is set when the booted slot's entry was on trial.
	Trial bool
	// Blessed is set when it was found good and its entry renamed.
	Blessed bool
	// Entry is the booted slot's entry.
	Entry string
	// RolledBack is set when this boot is the old slot again after the last update's slot
	// failed its tries.
	RolledBack *Rollback
}

// BootCheck runs at every boot of a disk-booted node. When the booted slot's entry is on
// trial it asks health (for at most bound) and blesses the entry (drops its counters: the slot
// is the node's from now on) when it answers nil; when health does not, the failure is
// recorded and returned, and the caller reboots so the try counts. When the node runs the old
// slot because the last update's slot ran out of tries, the rollback is recorded and returned.
func BootCheck(ctx context.Context, log *slog.Logger, disk Disk, root string, health Health, bound time.Duration, now func() time.Time) (BootOutcome, error) {
	entries, err := readEntries(disk.ESPDir)
	if err != nil {
		return BootOutcome{}, err
	}
	var out BootOutcome
	st, err := ReadState(root)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return out, err
	}
	var booted *Entry
	for i, e := range entries {
		if e.Slot == disk.Booted {
			booted = &entries[i]
		}
		if st != nil && e.Slot == st.Slot && e.Slot != disk.Booted && e.Bad() && st.RolledBack == nil {
			reason := "it did not come up"
			if st.LastFailure != "" {
				reason = st.LastFailure
			}
			st.RolledBack = &Rollback{At: now().UTC(), To: disk.Booted,
				Reason: fmt.Sprintf("slot %s (%s) failed its %d tries: %s", e.Slot, st.Image, e.TriesDone, reason)}
			if err := st.write(root); err != nil {
				return out, err
			}
			out.RolledBack = st.RolledBack
		}
	}
	if booted == nil {
		return out, fmt.Errorf("no boot entry for the booted slot %s on the ESP", disk.Booted)
	}
	out.Entry = booted.File
	if !booted.Counting {
		return out, nil
	}
	out.Trial = true
	log.Info("the booted slot is on trial: checking the node's health", "slot", disk.Booted, "entry", booted.File, "bound", bound)
	hctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	var last error
	for {
		if last = health(hctx); last == nil {
			break
		}
		select {
		case <-hctx.Done():
			if st != nil && st.Slot == disk.Booted {
				st.LastFailure = last.Error()
				if err := st.write(root); err != nil {
					return out, err
				}
			}
			return out, fmt.Errorf("slot %s is not healthy after %s: %w", disk.Booted, bound, last)
		case <-time.After(5 * time.Second):
		}
	}
	dir := filepath.Join(disk.ESPDir, nodeimage.LoaderEntriesDir)
	if err := os.Rename(filepath.Join(dir, booted.File), filepath.Join(dir, booted.blessedFile())); err != nil {
		return out, fmt.Errorf("bless %s: %w", booted.File, err)
	}
	if err := syncDir(disk.ESPDir); err != nil {
		return out, err
	}
	out.Blessed, out.Entry = true, booted.blessedFile()
	if st != nil && st.Slot == disk.Booted {
		st.Blessed, st.LastFailure = now().UTC(), ""
		if err := st.write(root); err != nil {
			return out, err
		}
	}
	return out, nil
}

// RollBack makes the slot not booted the default again: its entry gets the highest version,
// and the booted slot's entry stays as it is, below it. It refuses a slot without an entry or
// one systemd-boot gave up on, and returns the entry now default.
func RollBack(disk Disk, root, reason string, now func() time.Time) (string, error) {
	entries, err := readEntries(disk.ESPDir)
	if err != nil {
		return "", err
	}
	other := disk.Other()
	var target *Entry
	gen := 1
	for i, e := range entries {
		gen = max(gen, e.Generation()+1)
		if e.Slot == other.Letter {
			target = &entries[i]
		}
	}
	switch {
	case target == nil:
		return "", fmt.Errorf("slot %s has no boot entry: there is nothing to roll back to", other.Letter)
	case target.Bad():
		return "", fmt.Errorf("slot %s's entry %s ran out of tries: its image does not boot, refusing to roll back to it", other.Letter, target.File)
	}
	dir := filepath.Join(disk.ESPDir, nodeimage.LoaderEntriesDir)
	md := slotImage(disk.ESPDir, other.Letter)
	title := fmt.Sprintf("kiln slot %s", other.Letter)
	if md != nil {
		title = fmt.Sprintf("kiln %s %s (%s) slot %s", md.Name, md.Role, md.Kernel.Version, other.Letter)
	}
	name := target.File
	if err := atomicWrite(filepath.Join(dir, name), entryText(title, gen, other.Letter, target.Options)); err != nil {
		return "", err
	}
	if err := atomicWrite(espPath(disk.ESPDir, nodeimage.LoaderConfPath), loaderConf); err != nil {
		return "", err
	}
	if err := syncDir(disk.ESPDir); err != nil {
		return "", err
	}
	st, err := ReadState(root)
	if errors.Is(err, os.ErrNotExist) {
		st, err = &State{Slot: disk.Booted, From: other.Letter}, nil
	}
	if err != nil {
		return "", err
	}
	st.RolledBack = &Rollback{At: now().UTC(), To: other.Letter, Reason: reason}
	return name, st.write(root)
}
