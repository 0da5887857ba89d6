package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/coreos/ignition/v2/config/v3_6/types"

	"github.com/kilnproject/kiln/builder/vm"
	"github.com/kilnproject/kiln/initd/config"
	"github.com/kilnproject/kiln/internal/exitcode"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

// runLong is `kiln run --help`.
const runLong = `Run boots IMAGE (.raw, .qcow2, .vmdk or .vhd) on a q35 machine with OVMF, prints the serial
console, passes --config to kiln-init through fw_cfg (` + nodeimage.FWCfgName + `) and attaches each
--disk as a virtio disk whose serial is NAME (/dev/disk/by-id/virtio-NAME in the guest).
--root and a --disk's bus= put a disk on NVMe (an NVMe controller whose serial is the disk's, as
EBS volumes on EC2: serial vol0123456789abcdef0) or on virtio-scsi (with vendor= and product=, as
GCE persistent disks: vendor=Google,product=PersistentDisk, the serial the device name).
Several --config files are checked one by one, merged in the order given (Ignition's rules: a
later file's entry for the same path or unit wins) and passed as one Ignition config. Butane's
local keys (contents.local, ssh_authorized_keys_local, trees) read files below --files-dir, as
butane -d does.

Networking: the last NIC (enp0s24) is QEMU user networking (DHCP, the host at 10.0.2.2,
--forward'ed ports); --offline restricts it so the guest reaches neither the host nor the
outside, while forwarded ports still answer. Each --link NAME adds, before it (enp0s16, enp0s17,
…), a NIC on a private Ethernet segment shared by every VM on this host run with the same link
NAME (multicast on 127.0.0.1; no root, no tap). There is no DHCP on a link: give the guest an
address in its config, matching the NIC by MAC. The MAC is derived from IMAGE's file name and
NAME (logged when the VM starts) unless given as --link NAME,mac=MAC; two VMs booted from the
same file on one link need explicit MACs.

--accel auto (the default, or $KILN_ACCEL) boots the image's kernel under KVM for a few seconds
first and uses KVM only if that test boot really ran; otherwise TCG (software emulation).
--append boots the image's own kernel and initramfs directly (still under OVMF) with the loader
entry's command line plus the given arguments; the guest reaches the host at 10.0.2.2.
Without --snapshot the image itself is written to (first boot creates the data partition).
kiln bakes a disk only as large as its partitions; --root-size (default 4G) grows a smaller
IMAGE to that size first (with --snapshot, only the throwaway overlay), and first boot gives the
space to the data partition (/var), as on a cloud volume chosen larger than the image.

Network boot (--netboot URL): the machine boots as a rack's machines PXE-boot. OVMF tries
IMAGE first and, when it does not boot (missing: a diskless machine; blank; no ESP), the user
network's NIC runs iPXE, which takes a DHCP lease from QEMU and chains URL — typically
` + "`kiln serve`" + ` on the host, http://10.0.2.2:PORT/boot.ipxe. IMAGE is optional: without it the
machine is diskless (a live node). --blank SIZE creates IMAGE as a blank raw disk (sparse) when it
does not exist, a disk to install onto; when it exists, IMAGE is booted as it is, so the same
command boots the installed disk (the network stays offered second). --mac and --uuid set the
NIC's MAC and the SMBIOS UUID that kiln serve's machines.yaml matches (QEMU's defaults:
52:54:00:12:34:56 and all zeros). Under --accel auto a network boot without a kernel on IMAGE
runs under TCG (there is no kernel to test KVM with): give --accel kvm to use KVM.

An IMAGE ending in .iso (the iso format) is attached as a CD-ROM (scsi-cd on virtio-scsi) to a
machine without a disk, which boots it live; --disk adds disks (a blank one takes /var), and
--snapshot does not apply. Under --accel auto it runs under TCG (--accel kvm uses KVM).

--ssh PORT forwards 127.0.0.1:PORT to the guest's ssh server (port 22), enables ssh.service
(shipped disabled in the default base) in the config it passes and logs how to connect; a
--config without a user that has ssh keys, or one that disables ssh.service, is refused.

With --until-firstboot, kiln run exits 0 once first boot succeeded (or had already), 1 when it
failed and 3 when --timeout passed before the status line appeared (3 too for --until).

` + exitHelp

const runExample = `  kiln run out/qemu-worker.qcow2 --config node.ign
  kiln run out/qemu-worker.qcow2 --config node.bu --files-dir files/   # contents.local: motd reads files/motd
  kiln run out/qemu-worker.qcow2 --snapshot --until-firstboot --accel tcg
  kiln run out/qemu-control-plane.qcow2 --disk etcd-main=2G --forward 6443:6443
  kiln run out/qemu-worker.raw --root-size 20G    # grows the file to 20 GiB: /var gets ~19 of them
  kiln run out/qemu-worker.qcow2 --snapshot --config keys.bu --ssh 2222   # then: ssh -p 2222 core@127.0.0.1
  kiln run out/aws-worker.raw --snapshot --root nvme,serial=vol0aaaaaaaaaaaaaaaa --disk vol0123456789abcdef0=1G,bus=nvme
  kiln run out/gce-worker.raw --snapshot --root scsi,serial=persistent-disk-0,vendor=Google,product=PersistentDisk
  kiln run out/qemu-worker.qcow2 --snapshot --append 'kiln.config.url=http://10.0.2.2:8080/node.ign'
  kiln run cp-1.raw --config cp-1.ign --config debug.bu --link cluster,mac=02:00:00:00:00:01 --offline --forward 6443:6443
  kiln run worker-1.raw --config worker-1.ign --link cluster,mac=02:00:00:00:00:02 --offline
  # against kiln serve out/ --listen 127.0.0.1:8080 on this host:
  kiln run --netboot http://10.0.2.2:8080/boot.ipxe --mac 02:00:00:00:01:01 --until-firstboot
  kiln run out/metal-worker.iso --memory 3072 --until-firstboot    # live from a CD-ROM, no disk
  kiln run node-2.raw --blank 8G --netboot http://10.0.2.2:8080/boot.ipxe --mac 02:00:00:00:01:02 --disk etcd-main=2G`

// runOptions are `kiln run`'s flags.
type runOptions struct {
	cfg       vm.Config
	disks     []string
	root      string
	forwards  []string
	links     []string
	configs   []string
	filesDir  string
	accel     string
	timeout   time.Duration
	untilBoot bool
	until     string
	netboot   string
	mac       string
	blank     string
	rootSize  string
	ssh       int
}

func newRunCmd() *cobra.Command {
	var o runOptions
	cmd := &cobra.Command{
		Use:     "run [IMAGE]",
		Short:   "Boot an image in QEMU (UEFI) with its serial console on stdout",
		Long:    runLong,
		Example: runExample,
		Args:    cobra.RangeArgs(0, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			image := ""
			if len(args) == 1 {
				image = args[0]
			}
			return o.run(cmd.Context(), image, cmd.OutOrStdout())
		},
	}
	o.addFlags(cmd.Flags())
	return cmd
}

func (o *runOptions) addFlags(f *pflag.FlagSet) {
	f.StringVar(&o.filesDir, "files-dir", "", "directory Butane's local keys (contents.local, ssh_authorized_keys_local, trees) are relative to, as butane -d")
	f.StringArrayVar(&o.configs, "config", nil, "node config (Ignition v3 JSON or Butane YAML, checked here) passed through fw_cfg; repeatable: merged in order, later files win")
	f.StringArrayVar(&o.disks, "disk", nil, "extra disk NAME=SIZE (created) or NAME=FILE (attached, e.g. a CIDATA ISO)[,bus=virtio|nvme|scsi][,vendor=V][,product=P], repeatable; the guest sees a virtio disk as /dev/disk/by-id/virtio-NAME")
	f.StringVar(&o.root, "root", "", "the image's bus: virtio (default), nvme or scsi, BUS[,serial=S][,vendor=V][,product=P]; nvme needs a serial")
	f.StringVar(&o.cfg.Net, "net", "", "user network range, e.g. 10.0.3.0/24 (guest .15, host .2; default 10.0.2.0/24)")
	f.StringArrayVar(&o.forwards, "forward", nil, "forward a host TCP port to a guest port over the user network, [ADDR:]HOSTPORT:GUESTPORT (repeatable; ADDR defaults to 127.0.0.1)")
	f.StringArrayVar(&o.links, "link", nil, "NIC on the private segment NAME shared by this host's VMs, NAME[,mac=MAC] (repeatable; these NICs come first)")
	f.BoolVar(&o.cfg.Offline, "offline", false, "no route out of the guest: its user network reaches neither the host nor beyond (forwarded ports still answer)")
	f.StringVar(&o.accel, "accel", "", "auto, kvm or tcg (default $KILN_ACCEL or auto)")
	f.DurationVar(&o.timeout, "timeout", 0, "stop the VM after this long (default none; 15m with --until-firstboot)")
	f.StringVar(&o.until, "until", "", "stop once a console line matches this regular expression")
	f.BoolVar(&o.untilBoot, "until-firstboot", false, "stop once kiln-init prints its first-boot status line; fail if it failed")
	f.BoolVar(&o.cfg.Snapshot, "snapshot", false, "leave IMAGE unchanged (writes go to a throwaway overlay)")
	f.IntVar(&o.cfg.MemoryMB, "memory", 2048, "guest memory in MiB")
	f.IntVar(&o.cfg.CPUs, "cpus", 2, "guest CPUs")
	f.IntVar(&o.cfg.Nice, "nice", 0, "run QEMU at this host CPU niceness (1-19): a VM that may wait leaves the host's cores to others, e.g. a worker beside an emulated control plane")
	f.StringVar(&o.cfg.Append, "append", "", "extra kernel arguments, e.g. 'kiln.config.url=http://10.0.2.2:8080/${mac}.ign' (boots the image's kernel directly, bypassing the boot entries: a config's kernelArguments cannot take effect)")
	f.StringVar(&o.netboot, "netboot", "", "boot from the network when IMAGE does not boot (or is not given): iPXE chains this URL, e.g. http://10.0.2.2:8080/boot.ipxe")
	f.StringVar(&o.mac, "mac", "", "with --netboot: the booting NIC's MAC address, e.g. 02:00:00:00:01:01")
	f.StringVar(&o.cfg.UUID, "uuid", "", "the machine's SMBIOS UUID (iPXE's ${uuid})")
	f.StringVar(&o.rootSize, "root-size", "4G", "the least size the guest sees IMAGE at: a smaller IMAGE (baked only as large as its partitions) is grown in place first, or with --snapshot its throwaway overlay; first boot gives the space to /var; 0 boots IMAGE at its size")
	f.StringVar(&o.blank, "blank", "", "with --netboot: create IMAGE as a blank raw disk of this size (e.g. 8G) when it does not exist")
	f.IntVar(&o.ssh, "ssh", 0, "forward 127.0.0.1:PORT to the guest's ssh server, enable ssh.service in --config and print how to connect (a --config user needs sshAuthorizedKeys)")
	f.StringVar(&o.cfg.WorkDir, "workdir", "", "directory for the UEFI variable store and created disks (default: a temp dir)")
}

// run boots image and waits as the flags say.
func (o *runOptions) run(ctx context.Context, image string, serial io.Writer) error {
	cfg := o.cfg
	cfg.Image = image
	if strings.HasSuffix(image, nodeimage.ISOSuffix) {
		// The iso output boots live from a CD-ROM on a machine without a disk.
		cfg.Image, cfg.CDROM = "", image
	}
	cfg.Serial = serial
	if o.ssh != 0 {
		if o.ssh < 1 || o.ssh > 65535 {
			return exitcode.Usage(fmt.Errorf("--ssh %d: a TCP port, 1-65535", o.ssh))
		}
		for _, f := range o.forwards {
			if host, _, err := parseForward(f); err == nil && (host == strconv.Itoa(o.ssh) || host == "127.0.0.1:"+strconv.Itoa(o.ssh)) {
				return exitcode.Usage(fmt.Errorf("--ssh %d: host port %d is --forward %q's already", o.ssh, o.ssh, f))
			}
		}
		o.forwards = append(o.forwards, fmt.Sprintf("127.0.0.1:%d:22", o.ssh))
	}
	if err := o.parseNetwork(&cfg); err != nil {
		return exitcode.Usage(err)
	}
	if err := o.parseDisks(&cfg); err != nil {
		return exitcode.Usage(err)
	}
	if err := o.parseNetBoot(&cfg); err != nil {
		return exitcode.Usage(err)
	}
	var untilRE *regexp.Regexp
	if o.until != "" {
		re, err := regexp.Compile(o.until)
		if err != nil {
			return exitcode.Usage(fmt.Errorf("--until: %w", err))
		}
		untilRE = re
	}
	tmp, err := os.MkdirTemp("", "kiln-run-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	var sshUsers []string
	var edit func(*config.Config) error
	if o.ssh != 0 {
		edit = func(c *config.Config) (err error) {
			sshUsers, err = enableSSH(c)
			return err
		}
	}
	if len(o.configs) > 0 {
		if cfg.Config, err = nodeConfig(o.configs, tmp, o.filesDir, imageCheck(image), edit); err != nil {
			return err
		}
	}
	if err := o.createBlank(ctx, cfg.Image); err != nil {
		return err
	}
	if err := o.growRoot(ctx, &cfg); err != nil {
		return err
	}
	if err := o.chooseAccel(ctx, &cfg, tmp); err != nil {
		return err
	}
	// Under TCG a warm reset of OVMF can hang QEMU: a guest reboot restarts it instead.
	cfg.ColdReset = cfg.Accel == "tcg"
	timeout := o.timeout
	if (o.untilBoot || untilRE != nil) && timeout == 0 {
		timeout = 15 * time.Minute
	}
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	logLinks(cfg)
	m, err := vm.Start(ctx, cfg)
	if err != nil {
		return err
	}
	if o.ssh != 0 {
		if len(o.configs) == 0 {
			slog.Warn("--ssh without --config: the node's own config must enable ssh.service and give a user ssh keys")
		}
		logSSH(o.ssh, sshUsers)
	}
	defer m.Stop()
	return o.wait(ctx, m, untilRE, timeout)
}

// parseDisks reads --root and --disk NAME=SIZE or NAME=FILE, with their options, into cfg.
func (o *runOptions) parseDisks(cfg *vm.Config) error {
	if o.root != "" {
		bus, opts, _ := strings.Cut(o.root, ",")
		cfg.Root.Bus = vm.Bus(bus)
		if err := diskOptions(&cfg.Root, opts, true); err != nil {
			return fmt.Errorf("--root %q: %w (want BUS[,serial=S][,vendor=V][,product=P])", o.root, err)
		}
	}
	for _, d := range o.disks {
		name, rest, _ := strings.Cut(d, "=")
		size, opts, _ := strings.Cut(rest, ",")
		if name == "" || size == "" {
			return fmt.Errorf("--disk %q: want NAME=SIZE or NAME=FILE, e.g. etcd-main=2G", d)
		}
		disk := vm.Disk{Name: name, Size: size}
		if fi, err := os.Stat(size); err == nil && fi.Mode().IsRegular() {
			disk = vm.Disk{Name: name, Path: size}
		}
		if err := diskOptions(&disk, opts, false); err != nil {
			return fmt.Errorf("--disk %q: %w (want NAME=SIZE[,bus=BUS][,vendor=V][,product=P])", d, err)
		}
		cfg.Disks = append(cfg.Disks, disk)
	}
	return nil
}

// diskOptions reads a disk's comma-separated KEY=VALUE options into d: bus= (extra disks),
// serial= (the root disk; an extra disk's serial is its name), vendor= and product=.
func diskOptions(d *vm.Disk, opts string, root bool) error {
	for opts != "" {
		var opt string
		opt, opts, _ = strings.Cut(opts, ",")
		k, v, _ := strings.Cut(opt, "=")
		switch {
		case v == "":
			return fmt.Errorf("option %q has no value", opt)
		case k == "bus" && !root:
			d.Bus = vm.Bus(v)
		case k == "serial" && root:
			d.Name = v
		case k == "vendor":
			d.Vendor = v
		case k == "product":
			d.Product = v
		default:
			return fmt.Errorf("unknown option %q", opt)
		}
	}
	return nil
}

// parseNetwork reads --forward and --link into cfg.
func (o *runOptions) parseNetwork(cfg *vm.Config) error {
	if len(o.forwards) > 0 {
		cfg.Forward = map[string]int{}
		for _, f := range o.forwards {
			host, guest, err := parseForward(f)
			if err != nil {
				return err
			}
			if _, dup := cfg.Forward[host]; dup {
				return fmt.Errorf("--forward %q: host port %s forwarded twice", f, host)
			}
			cfg.Forward[host] = guest
		}
	}
	for _, l := range o.links {
		link, err := parseLink(l)
		if err != nil {
			return err
		}
		cfg.Links = append(cfg.Links, link)
	}
	return nil
}

// chooseAccel sets cfg.Accel from --accel (or $KILN_ACCEL). For auto, and for --append, it
// copies the image's boot files into dir: auto test-boots its kernel under KVM, --append boots
// them directly.
func (o *runOptions) chooseAccel(ctx context.Context, cfg *vm.Config, dir string) error {
	want := o.accel
	if want == "" {
		want = os.Getenv("KILN_ACCEL")
	}
	kernel := ""
	if want == "" || want == "auto" || cfg.Append != "" {
		bf, err := vm.ExtractBoot(ctx, cfg.Image, dir)
		if err != nil && (cfg.NetBoot != nil || cfg.CDROM != "") && cfg.Append == "" {
			slog.Info("accelerator", "accel", "tcg", "why", "network or CD-ROM boot without a kernel on a disk to test KVM with (--accel kvm uses KVM)")
			cfg.Accel = "tcg"
			return nil
		}
		if err != nil {
			return fmt.Errorf("read the image's boot files: %w", err)
		}
		kernel = bf.Kernel
		if cfg.Append != "" {
			cfg.Boot = bf
		}
	}
	a, why, err := vm.ChooseAccel(ctx, want, kernel)
	if err != nil {
		return err
	}
	slog.Info("accelerator", "accel", a, "why", why)
	cfg.Accel = a
	return nil
}

// parseNetBoot reads --netboot, --mac and --blank into cfg: a machine without IMAGE must boot
// from the network, and --mac and --blank only mean something for a network boot.
func (o *runOptions) parseNetBoot(cfg *vm.Config) error {
	if o.netboot == "" {
		switch {
		case cfg.Image == "" && cfg.CDROM == "":
			return errors.New("no IMAGE given: name a disk image, an iso, or --netboot URL for a diskless network boot")
		case o.mac != "":
			return errors.New("--mac sets the network-booting NIC's address: it needs --netboot")
		case o.blank != "":
			return errors.New("--blank creates a disk to install onto from the network: it needs --netboot")
		}
		return nil
	}
	if o.blank != "" && cfg.Image == "" {
		return errors.New("--blank SIZE: name the disk IMAGE to create")
	}
	cfg.NetBoot = &vm.NetBoot{BootFile: o.netboot, MAC: o.mac}
	mac := o.mac
	if mac == "" {
		mac = "52:54:00:12:34:56 (QEMU's default)"
	}
	slog.Info("network boot", "bootfile", o.netboot, "mac", mac)
	return nil
}

// growRoot applies --root-size to IMAGE: grown in place now, or, with --snapshot, by vm.Start
// in the throwaway overlay. A --blank disk keeps the size it was given.
func (o *runOptions) growRoot(ctx context.Context, cfg *vm.Config) error {
	if o.rootSize == "0" || cfg.Image == "" || o.blank != "" {
		return nil
	}
	if _, err := vm.ParseSize(o.rootSize); err != nil {
		return exitcode.Usage(fmt.Errorf("--root-size: %w", err))
	}
	if cfg.Snapshot {
		cfg.RootSize = o.rootSize
		return nil
	}
	grown, err := vm.GrowDisk(ctx, cfg.Image, o.rootSize)
	if err != nil {
		return fmt.Errorf("--root-size %s: %w (--snapshot grows a throwaway overlay instead; --root-size 0 boots IMAGE at its size)", o.rootSize, err)
	}
	if grown {
		slog.Info("grew the image's disk for /var (--root-size)", "image", cfg.Image, "size", o.rootSize)
	}
	return nil
}

// createBlank creates IMAGE as a sparse raw disk of --blank's size when it does not exist yet,
// with qemu-img, which reads sizes as kiln run's --disk does. An existing IMAGE is kept: it is
// the disk a previous boot installed onto.
func (o *runOptions) createBlank(ctx context.Context, image string) error {
	if o.blank == "" {
		return nil
	}
	if _, err := os.Stat(image); err == nil {
		slog.Info("disk exists, booting it as it is", "image", image)
		return nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return err
	}
	format := map[string]string{".raw": "raw", ".img": "raw", ".qcow2": "qcow2"}[strings.ToLower(filepath.Ext(image))]
	if format == "" {
		return exitcode.Usage(fmt.Errorf("--blank: %s: name the disk to create *.raw, *.img or *.qcow2", image))
	}
	if err := vm.QEMUImg(ctx, "create", "-q", "-f", format, image, o.blank); err != nil {
		os.Remove(image)
		return exitcode.Usage(fmt.Errorf("--blank %s: %w", o.blank, err))
	}
	slog.Info("created a blank disk", "image", image, "size", o.blank)
	return nil
}

// logLinks logs each link NIC's MAC address and multicast group.
func logLinks(cfg vm.Config) {
	for _, l := range cfg.Links {
		mac := l.MAC
		if mac == "" {
			mac = vm.LinkMAC(cfg.Image, l.Name)
		}
		slog.Info("link", "name", l.Name, "mac", mac, "group", vm.LinkGroup(l.Name))
	}
}

// console is the running VM as kiln run waits for it.
type console interface {
	WaitFor(ctx context.Context, re *regexp.Regexp) (string, error)
	Wait() error
}

// wait waits for the --until pattern, for the first-boot status line (--until-firstboot) or
// for the VM to end. Running out of time while waiting for a line is a timeout, and a
// failed first boot an error.
func (o *runOptions) wait(ctx context.Context, m console, untilRE *regexp.Regexp, timeout time.Duration) error {
	re := untilRE
	if re == nil && o.untilBoot {
		re = nodeimage.StatusLineRE
	}
	if re == nil {
		err := m.Wait()
		if ctx.Err() == context.DeadlineExceeded {
			return fmt.Errorf("stopped after --timeout %s", timeout)
		}
		return err
	}
	line, err := m.WaitFor(ctx, re)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return exitcode.Timeout(fmt.Errorf("no console line matched within --timeout %s: %w", timeout, err))
		}
		return err
	}
	if untilRE != nil {
		return nil
	}
	if st, _ := nodeimage.ParseStatusLine(line); st.Outcome == nodeimage.OutcomeFailed {
		return fmt.Errorf("first boot failed: %s", line)
	}
	return nil
}

// parseForward reads --forward [ADDR:]HOSTPORT:GUESTPORT into vm.Config.Forward's key and value.
func parseForward(f string) (host string, guest int, err error) {
	i := strings.LastIndex(f, ":")
	bad := fmt.Errorf("--forward %q: want [ADDR:]HOSTPORT:GUESTPORT, e.g. 6443:6443 or 127.0.0.1:8443:443", f)
	if i <= 0 {
		return "", 0, bad
	}
	host = f[:i]
	if guest, err = strconv.Atoi(f[i+1:]); err != nil || guest < 1 || guest > 65535 {
		return "", 0, bad
	}
	port := host
	if j := strings.LastIndex(host, ":"); j >= 0 {
		if j == 0 {
			return "", 0, bad
		}
		port = host[j+1:]
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return "", 0, bad
	}
	return host, guest, nil
}

// parseLink reads --link NAME[,mac=MAC].
func parseLink(s string) (vm.Link, error) {
	name, opts, _ := strings.Cut(s, ",")
	l := vm.Link{Name: name}
	if name == "" {
		return l, fmt.Errorf("--link %q: want NAME[,mac=MAC]", s)
	}
	for opts != "" {
		var opt string
		opt, opts, _ = strings.Cut(opts, ",")
		k, v, _ := strings.Cut(opt, "=")
		switch {
		case k == "mac" && v != "":
			l.MAC = v
		default:
			return l, fmt.Errorf("--link %q: unknown option %q (want NAME[,mac=MAC])", s, opt)
		}
	}
	return l, nil
}

// nodeConfig checks node configs the way kiln-init will (so mistakes show before a boot) and
// returns the file to pass through fw_cfg. One Ignition JSON file is passed as is; Butane YAML
// is translated to Ignition JSON in dir; several files are merged in order (later ones win, by
// Ignition's rules) into one Ignition JSON file in dir. Butane's local keys read files below
// filesDir. check, when set, is given the merged config first (kiln run checks it against the
// image); edit, when set, changes it, and the result is passed as Ignition JSON.
func nodeConfig(paths []string, dir, filesDir string, check, edit func(*config.Config) error) (string, error) {
	merged, err := loadConfigs(paths, filesDir)
	if err != nil {
		return "", fmt.Errorf("--config %w", err)
	}
	if check != nil {
		if err := check(merged); err != nil {
			return "", fmt.Errorf("--config %s %w", strings.Join(paths, " + "), err)
		}
	}
	out := filepath.Join(dir, "config.ign")
	if edit != nil {
		if err := edit(merged); err != nil {
			return "", fmt.Errorf("--config %s: %w", strings.Join(paths, " + "), err)
		}
	}
	if len(paths) > 1 || edit != nil {
		if err := merged.Validate(); err != nil {
			return "", fmt.Errorf("--config %s: %w", strings.Join(paths, " + "), err)
		}
		js, err := merged.JSON()
		if err != nil {
			return "", err
		}
		if err := os.WriteFile(out, js, 0o600); err != nil {
			return "", err
		}
		return out, nil
	}
	raw, err := os.ReadFile(paths[0])
	if err != nil {
		return "", err
	}
	if !isButaneText(raw) {
		return paths[0], nil // Ignition JSON (or gzip'd): passed as is
	}
	ign, err := config.TranslateButaneWith(raw, config.Options{FilesDir: filesDir})
	if err != nil {
		return "", fmt.Errorf("--config %s: %w", paths[0], err)
	}
	if err := os.WriteFile(out, ign, 0o600); err != nil {
		return "", err
	}
	return out, nil
}

// enableSSH enables ssh.service in c (the image ships it disabled) and returns the users c
// gives ssh keys, for kiln run --ssh. A config without such a user, or one that disables or
// masks ssh.service, is refused: the forwarded port would lead nowhere.
func enableSSH(c *config.Config) ([]string, error) {
	users := c.SSHUsers()
	if len(users) == 0 {
		return nil, errors.New("--ssh: no user in the config has sshAuthorizedKeys (passwd.users[].sshAuthorizedKeys; Butane: ssh_authorized_keys)")
	}
	on := true
	units := c.Ignition.Systemd.Units
	for i, u := range units {
		if u.Name != config.SSHUnit {
			continue
		}
		if u.Mask != nil && *u.Mask {
			return nil, fmt.Errorf("--ssh: systemd.units[%d] masks %s", i, config.SSHUnit)
		}
		if u.Enabled != nil && !*u.Enabled {
			return nil, fmt.Errorf("--ssh: systemd.units[%d] disables %s", i, config.SSHUnit)
		}
		units[i].Enabled = &on
		return users, nil
	}
	c.Ignition.Systemd.Units = append(units, types.Unit{Name: config.SSHUnit, Enabled: &on})
	return users, nil
}

// logSSH says how to reach the guest's ssh server through the forwarded port. The host key
// is new on every fresh node, so the command does not record it.
func logSSH(port int, users []string) {
	user := "USER"
	if len(users) > 0 {
		user = users[0]
	}
	slog.Info("ssh", "connect", fmt.Sprintf("ssh -p %d -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null %s@127.0.0.1", port, user),
		"users", strings.Join(users, ","), "note", "answers once the node has booted")
}

// imageCheck checks a config against what the image holds, as kiln check-config does, when
// the bake's metadata is beside image; otherwise it says why the config is not checked.
func imageCheck(image string) func(*config.Config) error {
	if image == "" {
		return nil
	}
	md, mdFile, err := imageMetadata(image)
	switch {
	case err != nil:
		slog.Warn("--config not checked against the image", "reason", err)
		return nil
	case md.Contents == nil:
		slog.Warn("--config not checked against the image's contents", "reason", mdFile+" records no contents (an image baked by an older kiln)")
	}
	return func(c *config.Config) error {
		err := c.CheckRole(config.Role(md.Role))
		if md.Contents != nil {
			err = errors.Join(c.CheckImage(md.Contents), err)
		}
		if err != nil {
			return fmt.Errorf("against %s:\n%w", mdFile, err)
		}
		return nil
	}
}
