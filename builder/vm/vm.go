// Package vm boots kiln images in QEMU: UEFI (OVMF) on a q35 machine, the serial console streamed
// line by line, the node config passed through fw_cfg, disks on virtio, NVMe or SCSI buses with
// stable serials (the root disk on NVMe as on EC2, on SCSI as on GCE), QEMU user
// networking (optionally offline) and NICs on private links shared by VMs on the host. It
// chooses between KVM and TCG with a bounded probe boot, because /dev/kvm can exist and still hang.
package vm

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/google/uuid"

	"github.com/kilnproject/kiln/internal/atomicfile"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

// Bus is how a disk is attached to the guest.
type Bus string

// The buses a disk can sit on.
const (
	// BusVirtio is a virtio-blk PCI device (the default): /dev/vdX, by-id virtio-<serial>.
	BusVirtio Bus = "virtio"
	// BusNVMe is an NVMe controller of its own, the disk its namespace 1: /dev/nvmeXn1, the
	// serial that of the controller (at most 20 bytes, required), as EBS volumes on EC2.
	BusNVMe Bus = "nvme"
	// BusSCSI is a scsi-hd on a virtio-scsi controller shared by all SCSI disks: /dev/sdX,
	// with the INQUIRY Vendor and Product given (as GCE persistent disks: Google,
	// PersistentDisk, the serial the device name).
	BusSCSI Bus = "scsi"
)

// Disk is a disk attached to the guest; the guest sees an extra virtio disk as
// /dev/disk/by-id/virtio-<Name>.
type Disk struct {
	Name string // serial, e.g. etcd-main
	Size string // qemu-img size, e.g. 1G; ignored when Path names an existing file
	Path string // optional existing image (qcow2 or raw); created in the work dir when empty
	Bus  Bus    // BusVirtio when empty
	// Vendor (at most 8 bytes) and Product (at most 16) are a SCSI disk's INQUIRY strings;
	// empty leaves QEMU's (QEMU, QEMU HARDDISK).
	Vendor, Product string
}

// Config describes one boot.
type Config struct {
	// Image is the disk the firmware boots first (raw, qcow2, vmdk, vhd). It may be empty
	// only with NetBoot or CDROM: a diskless machine.
	Image string
	// CDROM is an ISO image attached read-only as a SCSI CD-ROM (scsi-cd on virtio-scsi),
	// booted after Image, first when there is none.
	CDROM    string
	Snapshot bool // write to a throwaway overlay, leaving Image unchanged
	// RootSize (a qemu-img size such as 4G) is the least size the guest sees Image at: kiln
	// bakes a disk only as large as its partitions, and first boot gives the data partition
	// (/var) what the disk has beyond them, as on a cloud volume chosen larger. A smaller Image
	// is grown in place (qemu-img resize) before the boot; with Snapshot, the throwaway overlay
	// is made that large instead and Image is left as it is. Empty boots Image at its size.
	RootSize string
	Config   string // node config file passed through fw_cfg (Ignition JSON)
	// Root says how Image is attached: its Bus (virtio when empty), its serial (Name; none
	// when empty on virtio and SCSI, required on NVMe) and SCSI Vendor and Product. Size and
	// Path must be empty.
	Root     Disk
	Disks    []Disk
	Accel    string // kvm or tcg (resolve "auto" with ChooseAccel first)
	MemoryMB int    // default 2048
	CPUs     int    // default 2
	// Links are NICs on private segments shared with the other VMs on this host (see Link).
	// They come before the user network's NIC, so the guest's first NIC is Links[0].
	Links []Link
	// Forward maps host TCP ports to guest ports on the user network: "127.0.0.1:6443" or
	// "6443" (on 127.0.0.1) -> 6443.
	Forward map[string]int
	// ForwardTo maps host TCP ports to an address and port the guest has on another NIC
	// than the user network's ("127.0.0.1:23791" -> "192.168.100.21:2379"): the user network
	// delivers the connection to that address, which a service listening on the guest's
	// private link only answers.
	ForwardTo map[string]string
	// Net is the user network's IPv4 range (QEMU's default 10.0.2.0/24): the guest gets .15,
	// the host is .2. Several VMs on different ranges get different addresses.
	Net string
	// NetHost is the host's address on the user network (QEMU's default: .2 of Net), which
	// reaches the host's loopback; a cloud's metadata address (169.254.169.254) lets a
	// metadata service on 127.0.0.1 answer as the cloud's does. NetDHCPStart is the first
	// address DHCP hands out (default .15 of Net). Both must be inside Net.
	NetHost, NetDHCPStart string
	// Offline restricts the user network (QEMU restrict=on): the guest reaches neither the
	// host (10.0.2.2) nor anything beyond; forwarded ports still reach the guest.
	Offline bool
	// NetBoot offers a network boot after the disk: the user network's NIC runs iPXE (the
	// NIC's option ROM) when Image does not boot — it is missing, blank or has no ESP.
	NetBoot *NetBoot
	// UUID is the machine's SMBIOS system UUID (iPXE's ${uuid}, /sys/class/dmi/id/product_uuid),
	// which `kiln serve` can match machines by; QEMU's all-zero one when empty.
	UUID string
	// Boot, when set, boots these files directly (QEMU -kernel/-initrd, still under OVMF)
	// instead of through the ESP's systemd-boot, with Append added to their command line.
	Boot    *BootFiles
	Append  string
	WorkDir string    // OVMF variables copy and created disks; a temp dir when empty
	Serial  io.Writer // every console line is copied here (may be nil)
	QEMU    string    // qemu-system-x86_64 binary; from PATH when empty
	Extra   []string  // extra QEMU arguments
	// ColdReset turns every guest reboot into a cold boot: QEMU runs with -no-reboot, and when
	// it exits after the guest kernel said "reboot: Restarting system" (or, panicking,
	// "Rebooting in N seconds"), Start runs it again
	// with the same disks and variable store, its console going on in the same Machine. Under
	// TCG a warm reset of an OVMF guest can hang QEMU for good (a vCPU spinning, nothing on the
	// console); a cold start does not. With Snapshot it has no effect: a new QEMU would start
	// from a new overlay, without what the guest wrote.
	ColdReset bool
	// Nice lowers QEMU's host CPU priority (1..19, as nice(1)): on a host with fewer cores than
	// its VMs' vCPUs, a VM that may wait (a worker joining) leaves the cycles to one that must
	// meet deadlines (an emulated control plane's leases and probes). 0 keeps the caller's.
	Nice int
}

// Firmware locates OVMF: the code (read-only) and a template for the variable store.
func Firmware() (code, vars string, err error) {
	pairs := [][2]string{
		{"/usr/share/OVMF/OVMF_CODE_4M.fd", "/usr/share/OVMF/OVMF_VARS_4M.fd"},
		{"/usr/share/OVMF/OVMF_CODE.fd", "/usr/share/OVMF/OVMF_VARS.fd"},
		{"/usr/share/edk2/ovmf/OVMF_CODE.fd", "/usr/share/edk2/ovmf/OVMF_VARS.fd"},
	}
	for _, p := range pairs {
		if fileExists(p[0]) && fileExists(p[1]) {
			return p[0], p[1], nil
		}
	}
	return "", "", errors.New("UEFI firmware not found (looked for /usr/share/OVMF/OVMF_CODE_4M.fd): install the Debian package ovmf")
}

func fileExists(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular()
}

// Machine is a running QEMU.
type Machine struct {
	workDir string
	ownWork bool

	mu       sync.Mutex
	cmd      *exec.Cmd // the QEMU running now (another after each cold reset)
	stopping bool
	restarts int
	cycling  bool // PowerCycle killed the running QEMU: start the next one
	snapshot bool // Config.Snapshot: a new QEMU would lose the guest's writes
	lines    []string
	lastLine time.Time     // when the last console line (or QEMU's start) came
	changed  chan struct{} // closed and replaced on every new line or exit
	done     bool
	exitErr  error
}

// Args returns the QEMU command line for cfg (without the binary), after creating the variable
// store copy, the root disk's overlay (Snapshot with RootSize) and any extra disks in workDir,
// and growing Image to RootSize.
func Args(ctx context.Context, cfg Config, workDir string) ([]string, error) {
	if cfg.Accel != "kvm" && cfg.Accel != "tcg" {
		return nil, fmt.Errorf("accelerator %q: want kvm or tcg", cfg.Accel)
	}
	if err := checkImage(cfg); err != nil {
		return nil, err
	}
	// NICs sit at fixed PCI slots and are placed first, so disks take the free slots around them.
	nics, err := netArgs(cfg)
	if err != nil {
		return nil, err
	}
	machine, err := machineArgs(cfg, workDir)
	if err != nil {
		return nil, err
	}
	root, err := rootDiskArgs(ctx, cfg, workDir)
	if err != nil {
		return nil, err
	}
	disks, err := extraDiskArgs(ctx, cfg.Disks, workDir)
	if err != nil {
		return nil, err
	}
	if cfg.CDROM != "" {
		index := 0
		if cfg.Image != "" {
			index = 1 // after the disk
		}
		root = append(root, "-drive", "if=none,id=cdrom,media=cdrom,readonly=on,format=raw,file="+qemuEscape(cfg.CDROM),
			"-device", fmt.Sprintf("scsi-cd,bus=%s.0,drive=cdrom,bootindex=%d", scsiController, index))
	}
	if usesSCSI(cfg) || cfg.CDROM != "" {
		root = append([]string{"-device", "virtio-scsi-pci,id=" + scsiController}, root...)
	}
	boot, err := bootArgs(cfg)
	if err != nil {
		return nil, err
	}
	args := append(machine, nics...)
	if cfg.Accel == "kvm" {
		args = append(args, "-cpu", "host")
	} else {
		args = append(args, "-cpu", "qemu64")
	}
	args = append(append(append(args, root...), disks...), boot...)
	return append(args, cfg.Extra...), nil
}

// machineArgs are the q35 machine with UEFI firmware (its variable store copied into workDir),
// memory, CPUs, the serial console, a random number generator and the SMBIOS UUID.
func machineArgs(cfg Config, workDir string) ([]string, error) {
	var uuidArgs []string
	if cfg.UUID != "" {
		id, err := uuid.Parse(cfg.UUID)
		if err != nil {
			return nil, fmt.Errorf("machine UUID %q: %w", cfg.UUID, err)
		}
		uuidArgs = []string{"-uuid", id.String()}
	}
	code, varsTmpl, err := Firmware()
	if err != nil {
		return nil, err
	}
	vars := filepath.Join(workDir, "OVMF_VARS.fd")
	if err := atomicfile.Copy(varsTmpl, vars, atomicfile.Options{Mode: 0o600}); err != nil {
		return nil, fmt.Errorf("copy UEFI variable store: %w", err)
	}
	mem, cpus := cfg.MemoryMB, cfg.CPUs
	if mem == 0 {
		mem = 2048
	}
	if cpus == 0 {
		cpus = 2
	}
	return append([]string{
		"-machine", "q35,accel=" + cfg.Accel,
		"-m", strconv.Itoa(mem), "-smp", strconv.Itoa(cpus),
		"-nodefaults", "-no-user-config", "-display", "none", "-monitor", "none",
		"-chardev", "stdio,id=serial0,signal=off", "-serial", "chardev:serial0",
		"-drive", "if=pflash,format=raw,unit=0,readonly=on,file=" + code,
		"-drive", "if=pflash,format=raw,unit=1,file=" + vars,
		"-device", "virtio-rng-pci",
	}, uuidArgs...), nil
}

// checkImage checks that Image exists, or that the machine is diskless and boots from the
// network.
func checkImage(cfg Config) error {
	if cfg.CDROM != "" {
		if _, err := os.Stat(cfg.CDROM); err != nil {
			return fmt.Errorf("cdrom: %w", err)
		}
	}
	if cfg.Image != "" {
		if _, err := os.Stat(cfg.Image); err != nil {
			return fmt.Errorf("image: %w", err)
		}
		return nil
	}
	switch {
	case cfg.NetBoot == nil && cfg.CDROM == "":
		return errors.New("image: none given (only a network or CD-ROM boot can be diskless)")
	case cfg.Root != Disk{}:
		return errors.New("root disk: a diskless machine has none to attach")
	case cfg.Snapshot:
		return errors.New("snapshot: a diskless machine has no disk to protect")
	}
	return nil
}

// rootDiskArgs attach the image as the boot disk (none for a diskless machine), grown to
// cfg.RootSize first: Image itself, or with Snapshot an overlay of that size in workDir.
func rootDiskArgs(ctx context.Context, cfg Config, workDir string) ([]string, error) {
	if cfg.Root.Size != "" || cfg.Root.Path != "" {
		return nil, errors.New("root disk: Size and Path must be empty (the root disk is Image)")
	}
	if cfg.Image == "" {
		if cfg.RootSize != "" {
			return nil, errors.New("root size: a diskless machine has no disk to grow")
		}
		return nil, nil
	}
	format, err := imageFormat(cfg.Image)
	if err != nil {
		return nil, err
	}
	file, snapshot := cfg.Image, cfg.Snapshot
	if cfg.RootSize != "" {
		if cfg.Snapshot {
			if file, format, err = snapshotOverlay(ctx, cfg.Image, format, cfg.RootSize, workDir); err != nil {
				return nil, err
			}
			snapshot = false // the overlay is the throwaway copy
		} else if _, err := GrowDisk(ctx, cfg.Image, cfg.RootSize); err != nil {
			return nil, err
		}
	}
	root := "if=none,id=root,cache=unsafe,discard=unmap,format=" + format + ",file=" + qemuEscape(file)
	if snapshot {
		root += ",snapshot=on"
	}
	dev, err := deviceArg(cfg.Root, "root")
	if err != nil {
		return nil, fmt.Errorf("root disk: %w", err)
	}
	if cfg.Boot == nil {
		dev += ",bootindex=0" // a direct kernel boot takes boot index 0 itself
	}
	return []string{"-drive", root, "-device", dev}, nil
}

// snapshotOverlay creates workDir/root-overlay.qcow2 on image (of format) and grows it to size
// when image is smaller, returning the overlay and its format.
func snapshotOverlay(ctx context.Context, image, format, size, workDir string) (string, string, error) {
	abs, err := filepath.Abs(image)
	if err != nil {
		return "", "", err
	}
	overlay := filepath.Join(workDir, "root-overlay.qcow2")
	if err := os.Remove(overlay); err != nil && !errors.Is(err, os.ErrNotExist) {
		return "", "", err
	}
	if err := QEMUImg(ctx, "create", "-q", "-f", "qcow2", "-F", format, "-b", abs, overlay); err != nil {
		return "", "", fmt.Errorf("root disk overlay: %w", err)
	}
	if _, err := GrowDisk(ctx, overlay, size); err != nil {
		return "", "", err
	}
	return overlay, "qcow2", nil
}

// GrowDisk grows the disk image p (raw, qcow2 or vhd, told by its name) to size, a qemu-img
// size such as 4G, when it is smaller, and says whether it did; a larger image is left as it
// is. Growing adds zeros at the end: the image's backup GPT stays where it was, and a kiln
// image's first boot moves it and gives the space to the data partition.
func GrowDisk(ctx context.Context, p, size string) (bool, error) {
	want, err := ParseSize(size)
	if err != nil {
		return false, err
	}
	format, err := imageFormat(p)
	if err != nil {
		return false, err
	}
	have, err := virtualSize(ctx, p, format)
	if err != nil {
		return false, err
	}
	if have >= want {
		return false, nil
	}
	if err := QEMUImg(ctx, "resize", "-q", "-f", format, p, strconv.FormatInt(want, 10)); err != nil {
		return false, fmt.Errorf("grow %s to %s: %w", p, size, err)
	}
	return true, nil
}

// virtualSize is the size of the disk the image p (of format) holds, as qemu-img reads it.
func virtualSize(ctx context.Context, p, format string) (int64, error) {
	out, err := exec.CommandContext(ctx, "qemu-img", "info", "--output=json", "-f", format, p).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return 0, fmt.Errorf("qemu-img info %s: %v: %s", p, err, strings.TrimSpace(string(ee.Stderr)))
		}
		return 0, fmt.Errorf("qemu-img info %s: %w", p, err)
	}
	var info struct {
		VirtualSize int64 `json:"virtual-size"`
	}
	if err := json.Unmarshal(out, &info); err != nil || info.VirtualSize <= 0 {
		return 0, fmt.Errorf("qemu-img info %s: no virtual size in %q", p, strings.TrimSpace(string(out)))
	}
	return info.VirtualSize, nil
}

// ParseSize reads a qemu-img size: a whole number of bytes, or of KiB, MiB, GiB or TiB with
// the suffix K, M, G or T (qemu-img's binary units; k is K), e.g. 4G.
func ParseSize(s string) (int64, error) {
	t, shift := s, 0
	if n := len(t); n > 0 {
		if i := strings.IndexByte("kKMGT", t[n-1]); i >= 0 {
			t, shift = t[:n-1], []int{10, 10, 20, 30, 40}[i]
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n <= 0 || n > (1<<62)>>shift {
		return 0, fmt.Errorf("size %q: want a positive whole number with an optional K, M, G or T (as qemu-img reads it), e.g. 4G", s)
	}
	return n << shift, nil
}

// QEMUImg runs qemu-img with args; an error carries the arguments and what it printed.
func QEMUImg(ctx context.Context, args ...string) error {
	out, err := exec.CommandContext(ctx, "qemu-img", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("qemu-img %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// scsiController is the id of the virtio-scsi controller that SCSI disks sit on.
const scsiController = "scsi0"

func usesSCSI(cfg Config) bool {
	if cfg.Root.Bus == BusSCSI {
		return true
	}
	for _, d := range cfg.Disks {
		if d.Bus == BusSCSI {
			return true
		}
	}
	return false
}

// deviceArg is the -device value attaching drive as d says: its bus, serial and SCSI strings.
func deviceArg(d Disk, drive string) (string, error) {
	if strings.ContainsAny(d.Name+d.Vendor+d.Product, ",=") {
		return "", fmt.Errorf("serial %q, vendor %q and product %q may not contain ',' or '='", d.Name, d.Vendor, d.Product)
	}
	if (d.Vendor != "" || d.Product != "") && d.Bus != BusSCSI {
		return "", fmt.Errorf("vendor and product need bus %s, not %q", BusSCSI, d.Bus)
	}
	var dev string
	switch d.Bus {
	case "", BusVirtio:
		dev = "virtio-blk-pci,drive=" + drive
	case BusNVMe:
		if d.Name == "" || len(d.Name) > 20 {
			return "", fmt.Errorf("an NVMe disk needs a serial of 1 to 20 bytes, not %q", d.Name)
		}
		dev = "nvme,drive=" + drive
	case BusSCSI:
		if len(d.Vendor) > 8 || len(d.Product) > 16 {
			return "", fmt.Errorf("SCSI vendor %q (at most 8 bytes) or product %q (at most 16) too long", d.Vendor, d.Product)
		}
		dev = "scsi-hd,bus=" + scsiController + ".0,drive=" + drive
		if d.Vendor != "" {
			dev += ",vendor=" + d.Vendor
		}
		if d.Product != "" {
			dev += ",product=" + d.Product
		}
	default:
		return "", fmt.Errorf("bus %q: want %s, %s or %s", d.Bus, BusVirtio, BusNVMe, BusSCSI)
	}
	if d.Name != "" {
		dev += ",serial=" + d.Name
	}
	return dev, nil
}

// extraDiskArgs attach the extra disks, creating in workDir those that name no file.
func extraDiskArgs(ctx context.Context, disks []Disk, workDir string) ([]string, error) {
	var args []string
	for i, d := range disks {
		if d.Name == "" || strings.ContainsAny(d.Name, ",= ") {
			return nil, fmt.Errorf("disk %d: name %q must be non-empty without ',', '=' or spaces", i, d.Name)
		}
		id := fmt.Sprintf("disk%d", i)
		dev, err := deviceArg(d, id)
		if err != nil {
			return nil, fmt.Errorf("disk %s: %w", d.Name, err)
		}
		p, dfmt := d.Path, "qcow2"
		if p == "" {
			p = filepath.Join(workDir, d.Name+".qcow2")
			if _, err := os.Stat(p); errors.Is(err, os.ErrNotExist) {
				if err := QEMUImg(ctx, "create", "-q", "-f", "qcow2", p, d.Size); err != nil {
					return nil, fmt.Errorf("disk %s: %w", d.Name, err)
				}
			}
		} else {
			f, err := imageFormat(p)
			if err != nil {
				return nil, fmt.Errorf("disk %s: %w", d.Name, err)
			}
			dfmt = f
		}
		args = append(args,
			"-drive", fmt.Sprintf("if=none,id=%s,cache=unsafe,format=%s,file=%s", id, dfmt, qemuEscape(p)),
			"-device", dev)
	}
	return args, nil
}

// bootArgs pass the node config through fw_cfg and, for a direct kernel boot, the kernel,
// initramfs and command line.
func bootArgs(cfg Config) ([]string, error) {
	var args []string
	if cfg.Config != "" {
		if _, err := os.Stat(cfg.Config); err != nil {
			return nil, fmt.Errorf("config: %w", err)
		}
		args = append(args, "-fw_cfg", "name="+nodeimage.FWCfgName+",file="+qemuEscape(cfg.Config))
	}
	if cfg.Boot != nil && cfg.NetBoot != nil {
		return nil, errors.New("a direct kernel boot and a network boot exclude each other")
	}
	if cfg.Boot != nil {
		args = append(args, "-kernel", cfg.Boot.Kernel, "-initrd", cfg.Boot.Initrd,
			"-append", strings.TrimSpace(cfg.Boot.Cmdline+" "+cfg.Append))
	} else if cfg.Append != "" {
		return nil, fmt.Errorf("kernel arguments %q need the image's boot files (direct kernel boot)", cfg.Append)
	}
	return args, nil
}

// qemuEscape doubles commas, QEMU's escape inside option values.
func qemuEscape(s string) string { return strings.ReplaceAll(s, ",", ",,") }

// imageFormat asks qemu-img what a disk image is, so raw images are never guessed.
func imageFormat(p string) (string, error) {
	switch strings.ToLower(filepath.Ext(p)) {
	case ".raw", ".img", ".iso":
		return "raw", nil
	case ".qcow2":
		return "qcow2", nil
	case ".vmdk":
		return "vmdk", nil
	case ".vhd":
		return "vpc", nil
	}
	return "", fmt.Errorf("%s: unknown disk format (want .raw, .img, .iso, .qcow2, .vmdk or .vhd)", p)
}

// Start boots cfg and returns at once; the console is read in the background.
func Start(ctx context.Context, cfg Config) (*Machine, error) {
	work, own := cfg.WorkDir, false
	if work == "" {
		d, err := os.MkdirTemp("", "kiln-run-")
		if err != nil {
			return nil, err
		}
		work, own = d, true
	}
	args, err := Args(ctx, cfg, work)
	if err != nil {
		if own {
			os.RemoveAll(work)
		}
		return nil, err
	}
	bin := cfg.QEMU
	if bin == "" {
		bin = "qemu-system-x86_64"
	}
	if _, err := exec.LookPath(bin); err != nil {
		return nil, fmt.Errorf("%s not found: install the Debian package qemu-system-x86", bin)
	}
	if cfg.Nice < 0 || cfg.Nice > 19 {
		if own {
			os.RemoveAll(work)
		}
		return nil, fmt.Errorf("nice %d: want 0 (unchanged) to 19", cfg.Nice)
	}
	coldReset := cfg.ColdReset && !cfg.Snapshot
	if coldReset {
		args = append(args, "-no-reboot")
	}
	newCmd := func() *exec.Cmd {
		cmd := exec.Command(bin, args...)
		if cfg.Nice > 0 {
			// nice(1) before exec, so every QEMU thread (vCPUs included) inherits the priority:
			// setpriority on a started process reaches its main thread only.
			cmd = exec.Command("nice", append([]string{"-n", strconv.Itoa(cfg.Nice), bin}, args...)...)
		}
		cmd.Stdin = nil
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		return cmd
	}
	m := &Machine{workDir: work, ownWork: own, changed: make(chan struct{}), snapshot: cfg.Snapshot, lastLine: time.Now()}
	cmd := newCmd()
	out, stderr, err := startQEMU(cmd)
	if err != nil {
		return nil, err
	}
	m.cmd = cmd
	go func() {
		for {
			m.readConsole(out, cfg.Serial)
			err := cmd.Wait()
			if err != nil && stderr.Len() > 0 {
				err = fmt.Errorf("qemu: %w: %s", err, strings.TrimSpace(stderr.String()))
			}
			m.mu.Lock()
			cycled := m.cycling
			m.cycling = false
			m.mu.Unlock()
			if cycled || err == nil && coldReset && m.guestReset() {
				next := newCmd()
				m.mu.Lock()
				if !m.stopping {
					out, stderr, err = startQEMU(next)
					if err == nil {
						cmd, m.cmd = next, next
						m.restarts++
						m.lastLine = time.Now()
						m.mu.Unlock()
						continue
					}
				}
				m.mu.Unlock()
			}
			m.mu.Lock()
			m.done, m.exitErr = true, err
			close(m.changed)
			m.changed = make(chan struct{})
			m.mu.Unlock()
			return
		}
	}()
	go func() {
		<-ctx.Done()
		m.Stop()
	}()
	return m, nil
}

// startQEMU starts cmd with its console (stdout) piped and its stderr kept.
func startQEMU(cmd *exec.Cmd) (io.ReadCloser, *strings.Builder, error) {
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, err
	}
	stderr := new(strings.Builder)
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		return nil, nil, fmt.Errorf("start qemu: %w", err)
	}
	return out, stderr, nil
}

// readConsole appends QEMU's console lines until it closes them.
func (m *Machine) readConsole(out io.Reader, serial io.Writer) {
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimRight(sc.Text(), "\r")
		if serial != nil {
			fmt.Fprintln(serial, line)
		}
		m.mu.Lock()
		m.lines = append(m.lines, line)
		m.lastLine = time.Now()
		close(m.changed)
		m.changed = make(chan struct{})
		m.mu.Unlock()
	}
}

// guestReset says whether the guest's kernel rebooted last (reboot(2), or a panic with panic=N)
// rather than powered off.
func (m *Machine) guestReset() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	for i := len(m.lines) - 1; i >= 0 && i >= len(m.lines)-20; i-- {
		switch {
		case strings.Contains(m.lines[i], "reboot: Restarting system"), // reboot(2)
			strings.Contains(m.lines[i], "Rebooting in "): // a panic with panic=N
			return true
		case strings.Contains(m.lines[i], "reboot: Power down"):
			return false
		}
	}
	return false
}

// PowerCycle pulls the plug and starts QEMU again on the same disks and variable store, as a
// cold reset does: the console goes on in the same Machine. It is refused for a Snapshot
// machine, whose writes a new QEMU would not see, and once the Machine is stopping or done.
func (m *Machine) PowerCycle() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case m.snapshot:
		return errors.New("power cycle: the machine runs on a snapshot, which a new QEMU would lose")
	case m.stopping || m.done:
		return errors.New("power cycle: the machine is stopped")
	case m.cmd.Process == nil:
		return errors.New("power cycle: QEMU has not started")
	}
	m.cycling = true
	if err := syscall.Kill(-m.cmd.Process.Pid, syscall.SIGKILL); err != nil {
		m.cycling = false
		return fmt.Errorf("power cycle: kill qemu: %w", err)
	}
	return nil
}

// Quiet is how long ago the console's last line came (or QEMU started, if later).
func (m *Machine) Quiet() time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	return time.Since(m.lastLine)
}

// Restarts is how many times a cold reset (Config.ColdReset) or a PowerCycle started QEMU again.
func (m *Machine) Restarts() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.restarts
}

// ErrExited is returned by WaitFor when QEMU ends before the pattern shows.
var ErrExited = errors.New("qemu exited")

// WaitFor blocks until a console line (from the start of the boot) matches re and returns it.
func (m *Machine) WaitFor(ctx context.Context, re *regexp.Regexp) (string, error) {
	return m.WaitFrom(ctx, 0, re)
}

// WaitFrom is WaitFor from console line from on (len(Lines()) taken earlier: what came since).
func (m *Machine) WaitFrom(ctx context.Context, from int, re *regexp.Regexp) (string, error) {
	seen := max(from, 0)
	for {
		m.mu.Lock()
		for ; seen < len(m.lines); seen++ {
			if re.MatchString(m.lines[seen]) {
				l := m.lines[seen]
				m.mu.Unlock()
				return l, nil
			}
		}
		done, exitErr, ch := m.done, m.exitErr, m.changed
		m.mu.Unlock()
		if done {
			if exitErr != nil {
				return "", fmt.Errorf("%w before %q: %v", ErrExited, re, exitErr)
			}
			return "", fmt.Errorf("%w before %q", ErrExited, re)
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return "", fmt.Errorf("waiting for %q: %w", re, ctx.Err())
		}
	}
}

// Lines returns the console so far.
func (m *Machine) Lines() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]string(nil), m.lines...)
}

// Wait blocks until QEMU exits.
func (m *Machine) Wait() error {
	for {
		m.mu.Lock()
		done, err, ch := m.done, m.exitErr, m.changed
		m.mu.Unlock()
		if done {
			return err
		}
		<-ch
	}
}

// Stop ends QEMU: SIGTERM (QEMU flushes its disks and exits), SIGKILL after 10 s. The guest is
// not shut down cleanly; callers that need its writes on disk wait for a line printed after sync.
func (m *Machine) Stop() {
	m.mu.Lock()
	m.stopping = true
	cmd := m.cmd
	m.mu.Unlock()
	if cmd.Process == nil {
		return
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = m.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
	}
	if m.ownWork {
		os.RemoveAll(m.workDir)
	}
}
