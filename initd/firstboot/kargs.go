package firstboot

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/kilnproject/kiln/initd/config"
	"github.com/kilnproject/kiln/internal/cmdline"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

// KernelArgsStatus is what first boot did for the config's kernelArguments.
type KernelArgsStatus struct {
	ShouldExist    []string `json:"shouldExist,omitempty"`
	ShouldNotExist []string `json:"shouldNotExist,omitempty"`
	// Entry is the boot loader entry on the ESP first boot wrote them into, e.g.
	// /loader/entries/kiln-a.conf, with the entries that changed its options line.
	Entry   string   `json:"entry,omitempty"`
	Added   []string `json:"added,omitempty"`
	Removed []string `json:"removed,omitempty"`
	// BootID is the boot (/proc/sys/kernel/random/boot_id) that asked for the reboot, at
	// Rebooted. Later runs keep the record: first boot reboots once for an entry.
	BootID   string    `json:"bootID,omitempty"`
	Rebooted time.Time `json:"rebooted,omitzero"`
}

// String describes the record for `kiln-init status`, e.g. "added mitigations=off, removed
// mitigations=auto,nosmt in /loader/entries/kiln-a.conf (rebooted 2026-03-01T12:00:00Z)".
func (k *KernelArgsStatus) String() string {
	if k.Entry == "" {
		return "on the kernel command line already"
	}
	return fmt.Sprintf("%s (rebooted %s)", k.change(), k.Rebooted.Format(time.RFC3339))
}

// change is what first boot changed in the boot entry, e.g. "added mitigations=off in
// /loader/entries/kiln-a.conf".
func (k *KernelArgsStatus) change() string {
	var changes []string
	if len(k.Added) > 0 {
		changes = append(changes, "added "+strings.Join(k.Added, ", "))
	}
	if len(k.Removed) > 0 {
		changes = append(changes, "removed "+strings.Join(k.Removed, ", "))
	}
	if len(changes) == 0 {
		changes = append(changes, "held already")
	}
	return strings.Join(changes, ", ") + " in " + k.Entry
}

// kernelArguments makes the running kernel's command line hold the config's kernelArguments.
// Kernel arguments only take effect at boot: when the kernel lacks them, kernelArguments
// writes them into the booted slot's boot entry on the ESP and sets st to StateRebooting, and
// first boot asks for one reboot (as Fedora CoreOS does) and runs again after it. When the
// entry already holds them and an earlier boot rebooted for them, the machine did not boot
// that entry: kernelArguments fails rather than reboot again.
func kernelArguments(ctx context.Context, opts Options, k config.KernelArgs, kernelLine string, st *Status) error {
	if k.Empty() {
		return nil
	}
	ks := &KernelArgsStatus{}
	if prev, err := ReadStatus(opts.Root); err == nil && prev.KernelArguments != nil {
		ks = prev.KernelArguments
	}
	ks.ShouldExist, ks.ShouldNotExist = k.ShouldExist, k.ShouldNotExist
	st.KernelArguments = ks
	missing, unwanted := k.Unmet(kernelLine)
	if len(missing) == 0 && len(unwanted) == 0 {
		opts.Log.Info("kernel arguments in effect", "shouldExist", k.ShouldExist, "shouldNotExist", k.ShouldNotExist)
		return nil
	}
	bootID, err := readBootID(opts)
	if err != nil {
		return fmt.Errorf("kernelArguments: %w", err)
	}
	entry, added, removed, err := writeBootEntry(opts, k, kernelLine)
	if err != nil {
		return fmt.Errorf("kernelArguments: %w", err)
	}
	if added == nil && removed == nil && ks.BootID != "" && ks.BootID != bootID {
		return fmt.Errorf("kernelArguments: %s on the ESP holds them and first boot rebooted for them (%s), but the kernel runs %s: "+
			"the machine does not boot that entry (a direct kernel boot, QEMU -kernel or kiln run --append, ignores it); give them on the command line it boots with",
			entry, ks.Rebooted.Format(time.RFC3339), unmet(missing, unwanted))
	}
	if added != nil || removed != nil {
		ks.Added, ks.Removed = added, removed
		opts.Log.Info("kernel arguments written; rebooting", "entry", entry, "added", added, "removed", removed)
	} else {
		opts.Log.Info("the boot entry holds the kernel arguments, the running kernel does not; rebooting once", "entry", entry, "kernel", unmet(missing, unwanted))
	}
	ks.Entry, ks.BootID, ks.Rebooted = entry, bootID, opts.Now().UTC()
	st.State = StateRebooting
	return nil
}

// unmet describes what the kernel command line lacks and has against kernelArguments.
func unmet(missing, unwanted []string) string {
	var parts []string
	if len(missing) > 0 {
		parts = append(parts, "without "+strings.Join(missing, ", "))
	}
	if len(unwanted) > 0 {
		parts = append(parts, "with "+strings.Join(unwanted, ", "))
	}
	return strings.Join(parts, " and ")
}

// writeBootEntry applies k to the options of the boot entry of the slot the node booted
// (the entry naming the root partition on kernelLine) and returns the entry's ESP path and
// what changed; nothing is written when nothing changes.
func writeBootEntry(opts Options, k config.KernelArgs, kernelLine string) (entry string, added, removed []string, err error) {
	root, _ := cmdline.Parse(kernelLine).Lookup("root")
	partuuid, ok := strings.CutPrefix(root, "PARTUUID=")
	if !ok || partuuid == "" {
		return "", nil, nil, errors.New("the node did not boot from a disk (no root=PARTUUID= on its kernel command line): " +
			"a network boot's kernel arguments are its boot script's (kiln serve, iPXE); give them there")
	}
	esp, where, err := openESP(opts, partuuid)
	if err != nil {
		return "", nil, nil, err
	}
	defer esp.Close()
	entry, text, err := bootedEntry(esp, partuuid)
	if err != nil {
		return "", nil, nil, fmt.Errorf("%s: %w", where, err)
	}
	options, _ := nodeimage.EntryOptions(text)
	edited, added, removed, err := k.Edit(options)
	if err != nil || (added == nil && removed == nil) {
		return entry, nil, nil, err
	}
	if err := esp.WriteFile(entry, []byte(nodeimage.WithEntryOptions(text, edited))); err != nil {
		return "", nil, nil, fmt.Errorf("write %s on %s: %w", entry, where, err)
	}
	if err := esp.Close(); err != nil {
		return "", nil, nil, fmt.Errorf("write %s on %s: %w", entry, where, err)
	}
	return entry, added, removed, nil
}

// bootedEntry finds the boot loader entry whose options name the root partition partuuid:
// the booted slot's (slot A's is nodeimage.LoaderEntryPath).
func bootedEntry(esp espFS, partuuid string) (name, text string, err error) {
	names, err := esp.ReadDir(nodeimage.LoaderEntriesDir)
	if err != nil {
		return "", "", fmt.Errorf("list %s: %w", nodeimage.LoaderEntriesDir, err)
	}
	slices.Sort(names)
	for _, n := range names {
		if !strings.HasSuffix(n, ".conf") {
			continue
		}
		p := path.Join(nodeimage.LoaderEntriesDir, n)
		data, err := esp.ReadFile(p)
		if err != nil {
			return "", "", fmt.Errorf("read %s: %w", p, err)
		}
		options, _ := nodeimage.EntryOptions(string(data))
		if root, _ := cmdline.Parse(options).Lookup("root"); strings.EqualFold(root, "PARTUUID="+partuuid) {
			return p, string(data), nil
		}
	}
	return "", "", fmt.Errorf("no boot entry in %s names root=PARTUUID=%s (entries: %s)", nodeimage.LoaderEntriesDir, partuuid, strings.Join(names, ", "))
}

// readBootID is the running boot's id, which a reboot changes.
func readBootID(opts Options) (string, error) {
	proc := opts.Facts.ProcRoot
	if proc == "" {
		proc = "/proc"
	}
	b, err := os.ReadFile(filepath.Join(proc, "sys/kernel/random/boot_id"))
	if err != nil {
		return "", fmt.Errorf("read the boot id: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}
