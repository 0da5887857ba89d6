package firstboot

import (
	"context"
	"errors"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	diskfs "github.com/diskfs/go-diskfs"
	"github.com/diskfs/go-diskfs/disk"
	"github.com/diskfs/go-diskfs/filesystem"
	"github.com/diskfs/go-diskfs/partition/gpt"

	"github.com/kilnproject/kiln/initd/source"
	"github.com/kilnproject/kiln/internal/nodeimage"
	"github.com/kilnproject/kiln/internal/testkit"
)

// The root partitions of a test node's two slots.
const (
	rootAGUID = "0f8c2a9e-6b1d-4d57-9a43-2c1e5b7d9f10"
	rootBGUID = "5d1e0c3b-7a2f-4e68-8b91-c4d3e2f1a0b9"
)

// slotOptions is the options line the bake writes into a slot's boot entry, with a
// mitigations= argument of the image definition's kernel.args.
func slotOptions(partuuid string) string {
	return "root=PARTUUID=" + partuuid + " rootfstype=erofs ro kiln.platform=qemu console=ttyS0,115200 mitigations=auto,nosmt"
}

// slotEntry is a boot loader entry as builder/disk.LoaderEntry writes it.
func slotEntry(slot, partuuid string) string {
	return "title kiln\nlinux /kiln/" + slot + "/vmlinuz\ninitrd /kiln/" + slot + "/initrd.img\noptions " + slotOptions(partuuid) + "\n"
}

// kargsConfig is the Fedora CoreOS kernel-args page's example as Ignition.
const kargsConfig = `{"ignition":{"version":"3.4.0"},"kernelArguments":{"shouldExist":["mitigations=off"],"shouldNotExist":["mitigations=auto,nosmt"]},` +
	`"storage":{"files":[{"path":"/etc/hostname","contents":{"source":"data:,node-1"}}]}}`

// noKargsConfig is a config without kernelArguments.
const noKargsConfig = `{"ignition":{"version":"3.4.0"},"storage":{"files":[{"path":"/etc/hostname","contents":{"source":"data:,node-1"}}]}}`

// rebootRecorder is the machine's reboot button: it counts the presses.
type rebootRecorder struct {
	whys []string
	err  error
}

func (r *rebootRecorder) Reboot(_ context.Context, why string) error {
	r.whys = append(r.whys, why)
	return r.err
}

// machine is a test node booting from an ESP-like directory: systemd-boot's entries on it,
// a root, a /proc with the boot id, and the reboot button.
type machine struct {
	t                *testing.T
	root, esp        string
	facts            FactsOptions // a /proc and /sys; the boot id in /proc
	boots            int
	reboot           rebootRecorder
	directKernelLine string // when set, the kernel command line of every boot, whatever the entries say
}

func newMachine(t *testing.T) *machine {
	m := &machine{t: t, root: t.TempDir(), esp: t.TempDir(), facts: fakeMachine(t, func() []netip.Prefix { return nil })}
	writeFile(t, filepath.Join(m.esp, nodeimage.LoaderConfPath), "default "+nodeimage.LoaderEntryName+"\ntimeout 0\n")
	writeFile(t, filepath.Join(m.esp, nodeimage.LoaderEntryPath), slotEntry("a", rootAGUID))
	writeFile(t, filepath.Join(m.esp, nodeimage.LoaderEntriesDir, "kiln-b.conf"), slotEntry("b", rootBGUID))
	return m
}

func writeFile(t *testing.T, p, text string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}

// boot boots the machine as its firmware would: a new boot id, the kernel command line of
// the entry file named (systemd-boot's, with the initrd= the EFI stub adds), and first boot
// with cfg from fw_cfg.
func (m *machine) boot(entry, cfg string) (*Status, error) {
	m.t.Helper()
	m.boots++
	writeFile(m.t, filepath.Join(m.facts.ProcRoot, "sys/kernel/random/boot_id"), strings.Repeat(string(rune('0'+m.boots)), 8)+"-0000-4000-8000-000000000000\n")
	line := m.directKernelLine
	if line == "" {
		options, _ := nodeimage.EntryOptions(testkit.ReadFile(m.t, filepath.Join(m.esp, entry)))
		line = `initrd=\kiln\a\initrd.img ` + options
	}
	return Run(context.Background(), Options{
		Root:      m.root,
		Cmdline:   line,
		Providers: []source.Provider{fwcfg(m.t, cfg), source.Embedded{Path: filepath.Join(m.root, "none")}},
		ESP:       m.esp,
		Facts:     m.facts,
		Rebooter:  &m.reboot,
		Now:       clock(time.Second),
	})
}

// First boot writes the config's kernelArguments into the booted slot's boot entry and
// reboots once; after the reboot, with the arguments in effect, it goes on and never reboots
// again. An entry the machine does not boot makes it fail instead of rebooting in a loop.
func TestKernelArguments(t *testing.T) {
	entryA, entryB := nodeimage.LoaderEntryPath, nodeimage.LoaderEntriesDir+"/kiln-b.conf"
	edited := strings.Replace(slotEntry("a", rootAGUID), "mitigations=auto,nosmt", "mitigations=off", 1)
	type boot struct {
		entry     string // the entry the firmware boots
		state     string
		err       string // what the error says, "" for none
		reboots   int    // reboots asked so far
		entryText string // slot A's entry after this boot
	}
	tests := []struct {
		name   string
		config string
		setup  func(m *machine)
		boots  []boot
	}{
		{name: "FCOS kernel-args page: written, one reboot, then on", config: kargsConfig, boots: []boot{
			{entry: entryA, state: StateRebooting, reboots: 1, entryText: edited},
			{entry: entryA, state: StateOK, reboots: 1, entryText: edited},
			{entry: entryA, state: StateOK, reboots: 1, entryText: edited}, // done already
		}},
		{name: "already on the command line: no write, no reboot", config: kargsConfig,
			setup: func(m *machine) { writeFile(t, filepath.Join(m.esp, entryA), edited) },
			boots: []boot{{entry: entryA, state: StateOK, reboots: 0, entryText: edited}}},
		{name: "a direct kernel boot ignores the entry: one reboot, then a failure", config: kargsConfig,
			setup: func(m *machine) { m.directKernelLine = slotOptions(rootAGUID) },
			boots: []boot{
				{entry: entryA, state: StateRebooting, reboots: 1, entryText: edited},
				{entry: entryA, state: StateFailed, reboots: 1, entryText: edited,
					err: "kernelArguments: /loader/entries/kiln-a.conf on the ESP holds them and first boot rebooted for them (2026-03-01T12:00:01Z), but the kernel runs without mitigations=off and with mitigations=auto,nosmt: the machine does not boot that entry"},
				{entry: entryA, state: StateFailed, reboots: 1, entryText: edited, err: "the machine does not boot that entry"},
			}},
		{name: "a network boot has no entry", config: kargsConfig,
			setup: func(m *machine) { m.directKernelLine = "ro kiln.platform=metal mitigations=auto,nosmt" },
			boots: []boot{{entry: entryA, state: StateFailed, entryText: slotEntry("a", rootAGUID),
				err: "kernelArguments: the node did not boot from a disk (no root=PARTUUID= on its kernel command line): a network boot's kernel arguments are its boot script's"}}},
		{name: "no kernelArguments: entries untouched", config: noKargsConfig,
			boots: []boot{{entry: entryA, state: StateOK, entryText: slotEntry("a", rootAGUID)}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := newMachine(t)
			if tc.setup != nil {
				tc.setup(m)
			}
			for i, b := range tc.boots {
				st, err := m.boot(b.entry, tc.config)
				if b.err == "" && err != nil || b.err != "" && (err == nil || !strings.Contains(err.Error(), b.err)) {
					t.Fatalf("boot %d: Run = %v, want error %q", i+1, err, b.err)
				}
				if st.State != b.state {
					t.Errorf("boot %d: state %q, want %q", i+1, st.State, b.state)
				}
				if _, onDisk := readStatusFile(t, m.root); onDisk.State != b.state {
					t.Errorf("boot %d: status.json says %q, want %q", i+1, onDisk.State, b.state)
				}
				if len(m.reboot.whys) != b.reboots {
					t.Errorf("boot %d: %d reboots asked (%q), want %d", i+1, len(m.reboot.whys), m.reboot.whys, b.reboots)
				}
				if got := testkit.ReadFile(t, filepath.Join(m.esp, entryA)); got != b.entryText {
					t.Errorf("boot %d: slot A's entry is\n%s\nwant\n%s", i+1, got, b.entryText)
				}
				if got := testkit.ReadFile(t, filepath.Join(m.esp, entryB)); got != slotEntry("b", rootBGUID) {
					t.Errorf("boot %d: slot B's entry changed:\n%s", i+1, got)
				}
			}
		})
	}
}

// The reboot first boot asks for says what it is for, and the status and console line say
// first boot goes on after it; a refused reboot fails first boot, recorded.
func TestKernelArgumentsReboot(t *testing.T) {
	m := newMachine(t)
	st, err := m.boot(nodeimage.LoaderEntryPath, kargsConfig)
	if err != nil {
		t.Fatal(err)
	}
	wantWhy := "kernel arguments added mitigations=off, removed mitigations=auto,nosmt in /loader/entries/kiln-a.conf"
	if len(m.reboot.whys) != 1 || m.reboot.whys[0] != wantWhy {
		t.Errorf("reboots %q, want [%q]", m.reboot.whys, wantWhy)
	}
	if want := "kiln-init: firstboot rebooting: " + wantWhy + "; first boot goes on after the reboot"; st.Line() != want {
		t.Errorf("Line = %q\nwant %q", st.Line(), want)
	}
	if nodeimage.StatusLineRE.MatchString(st.Line()) {
		t.Errorf("kiln run would take %q for first boot's outcome", st.Line())
	}
	k := st.KernelArguments
	if k == nil || k.Entry != nodeimage.LoaderEntryPath || k.BootID == "" || k.Rebooted.IsZero() {
		t.Fatalf("status kernelArguments = %+v", k)
	}

	m = newMachine(t)
	m.reboot.err = errors.New("systemctl reboot --no-block: exit status 1")
	st, err = m.boot(nodeimage.LoaderEntryPath, kargsConfig)
	if err == nil || !strings.Contains(err.Error(), "reboot for the kernel arguments written to /loader/entries/kiln-a.conf: systemctl reboot") {
		t.Fatalf("Run = %v, want the failed reboot", err)
	}
	if _, onDisk := readStatusFile(t, m.root); onDisk.State != StateFailed || onDisk.KernelArguments == nil {
		t.Errorf("status.json = %+v, want failed with the kernel arguments", onDisk)
	}
}

// On a real node first boot finds the ESP itself: the EFI system partition of the disk that
// holds the root partition root=PARTUUID= names, a FAT filesystem it edits without mounting.
func TestKernelArgumentsFATESP(t *testing.T) {
	const mib = 1 << 20
	dir := t.TempDir()
	img := filepath.Join(dir, "dev", "vda")
	if err := os.MkdirAll(filepath.Dir(img), 0o755); err != nil {
		t.Fatal(err)
	}
	d, err := diskfs.Create(img, 48*mib, 512)
	if err != nil {
		t.Fatal(err)
	}
	table := &gpt.Table{LogicalSectorSize: 512, PhysicalSectorSize: 512, ProtectiveMBR: true, Partitions: []*gpt.Partition{
		{Index: 1, Start: 2048, End: 2048 + 40*2048 - 1, Type: gpt.EFISystemPartition, Name: nodeimage.ESPName},
		{Index: 2, Start: 2048 + 40*2048, End: 2048 + 44*2048 - 1, Type: gpt.Type(strings.ToUpper(nodeimage.TypeRootX86)),
			Name: nodeimage.RootAName, GUID: strings.ToUpper(rootAGUID)},
	}}
	if err := d.Partition(table); err != nil {
		t.Fatal(err)
	}
	fs, err := d.CreateFilesystem(disk.FilesystemSpec{Partition: 1, FSType: filesystem.TypeFat32, VolumeLabel: nodeimage.ESPLabel})
	if err != nil {
		t.Fatal(err)
	}
	if err := fs.Mkdir(nodeimage.LoaderEntriesDir); err != nil {
		t.Fatal(err)
	}
	writeFAT(t, fs, nodeimage.LoaderEntryPath, slotEntry("a", rootAGUID))
	d.Close()
	sys := filepath.Join(dir, "sys")
	writeFile(t, filepath.Join(sys, "block", "vda", "size"), "98304\n")
	facts := fakeMachine(t, func() []netip.Prefix { return nil })
	facts.SysRoot = sys
	writeFile(t, filepath.Join(facts.ProcRoot, "sys/kernel/random/boot_id"), "1e6c5a32-0000-4000-8000-000000000001\n")

	var reboot rebootRecorder
	root := t.TempDir()
	st, err := Run(context.Background(), Options{
		Root:      root,
		Cmdline:   slotOptions(rootAGUID),
		Providers: []source.Provider{fwcfg(t, kargsConfig)},
		DevDir:    filepath.Join(dir, "dev"),
		Facts:     facts,
		Rebooter:  &reboot,
		Now:       clock(time.Second),
	})
	if err != nil || st.State != StateRebooting || len(reboot.whys) != 1 {
		t.Fatalf("Run = %v, state %q, reboots %q", err, st.State, reboot.whys)
	}
	d, err = diskfs.Open(img, diskfs.WithOpenMode(diskfs.ReadOnly))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	fs, err = d.GetFilesystem(1)
	if err != nil {
		t.Fatal(err)
	}
	f, err := fs.OpenFile(nodeimage.LoaderEntryPath, os.O_RDONLY)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(f)
	if err != nil {
		t.Fatal(err)
	}
	if want := strings.Replace(slotEntry("a", rootAGUID), "mitigations=auto,nosmt", "mitigations=off", 1); string(got) != want {
		t.Errorf("the entry on the FAT ESP is\n%s\nwant\n%s", got, want)
	}
}

func writeFAT(t *testing.T, fs filesystem.FileSystem, name, text string) {
	t.Helper()
	f, err := fs.OpenFile(name, os.O_CREATE|os.O_RDWR|os.O_TRUNC)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(f, text); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}
