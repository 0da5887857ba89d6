package main

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/kilnproject/kiln/builder/vm"
	"github.com/kilnproject/kiln/initd/config"
)

// firstbootLine matches the status line kiln-init prints on the console.
var firstbootLine = regexp.MustCompile(`kiln-init: firstboot (ok|failed|done already)`)

func newRunCmd() *cobra.Command {
	var (
		cfg       vm.Config
		disks     []string
		forwards  []string
		accel     string
		timeout   time.Duration
		untilBoot bool
		until     string
	)
	cmd := &cobra.Command{
		Use:   "run IMAGE",
		Short: "Boot an image in QEMU (UEFI) with its serial console on stdout",
		Long: `Run boots IMAGE (.raw, .qcow2, .vmdk or .vhd) on a q35 machine with OVMF, prints the serial
console, passes --config to kiln-init through fw_cfg (opt/dev.kiln/config) and attaches each
--disk as a virtio disk whose serial is NAME (/dev/disk/by-id/virtio-NAME in the guest).

--accel auto (the default, or $KILN_ACCEL) boots the image's kernel under KVM for a few seconds
first and uses KVM only if that test boot really ran; otherwise TCG (software emulation).
--append boots the image's own kernel and initramfs directly (still under OVMF) with the loader
entry's command line plus the given arguments; the guest reaches the host at 10.0.2.2.
Without --snapshot the image itself is written to (first boot creates the data partition).`,
		Example: `  kiln run out/qemu-worker.qcow2 --config node.ign
  kiln run out/qemu-worker.qcow2 --snapshot --until-firstboot --accel tcg
  kiln run out/qemu-control-plane.qcow2 --disk etcd-main=1G --forward 6443:6443
  kiln run out/qemu-worker.qcow2 --snapshot --append 'kiln.config.url=http://10.0.2.2:8080/node.ign'`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			cfg.Image = args[0]
			for _, d := range disks {
				name, size, ok := strings.Cut(d, "=")
				if !ok || name == "" || size == "" {
					return fmt.Errorf("--disk %q: want NAME=SIZE or NAME=FILE, e.g. etcd-main=1G", d)
				}
				if fi, err := os.Stat(size); err == nil && fi.Mode().IsRegular() {
					cfg.Disks = append(cfg.Disks, vm.Disk{Name: name, Path: size})
					continue
				}
				cfg.Disks = append(cfg.Disks, vm.Disk{Name: name, Size: size})
			}
			if len(forwards) > 0 {
				cfg.Forward = map[string]int{}
				for _, f := range forwards {
					host, guest, ok := strings.Cut(f, ":")
					var g int
					if _, err := fmt.Sscanf(guest, "%d", &g); !ok || err != nil || host == "" {
						return fmt.Errorf("--forward %q: want HOSTPORT:GUESTPORT", f)
					}
					cfg.Forward[host] = g
				}
			}
			if cfg.Config != "" {
				dir, err := os.MkdirTemp("", "kiln-config-")
				if err != nil {
					return err
				}
				defer os.RemoveAll(dir)
				if cfg.Config, err = nodeConfig(cfg.Config, dir); err != nil {
					return err
				}
			}
			want := accel
			if want == "" {
				want = os.Getenv("KILN_ACCEL")
			}
			kernel := ""
			if want == "" || want == "auto" || cfg.Append != "" {
				dir, err := os.MkdirTemp("", "kiln-boot-")
				if err != nil {
					return err
				}
				defer os.RemoveAll(dir)
				bf, err := vm.ExtractBoot(ctx, cfg.Image, dir)
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
			cfg.Serial = cmd.OutOrStdout()
			var untilRE *regexp.Regexp
			if until != "" {
				if untilRE, err = regexp.Compile(until); err != nil {
					return fmt.Errorf("--until: %w", err)
				}
			}
			if (untilBoot || untilRE != nil) && timeout == 0 {
				timeout = 15 * time.Minute
			}
			if timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, timeout)
				defer cancel()
			}
			m, err := vm.Start(ctx, cfg)
			if err != nil {
				return err
			}
			defer m.Stop()
			if untilRE != nil {
				_, err := m.WaitFor(ctx, untilRE)
				return err
			}
			if !untilBoot {
				err := m.Wait()
				if ctx.Err() == context.DeadlineExceeded {
					return fmt.Errorf("stopped after --timeout %s", timeout)
				}
				return err
			}
			line, err := m.WaitFor(ctx, firstbootLine)
			if err != nil {
				return err
			}
			if strings.Contains(line, "firstboot failed") {
				return fmt.Errorf("first boot failed: %s", line)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Config, "config", "", "node config (Ignition v3 JSON or Butane YAML, checked here) passed through fw_cfg")
	f.StringArrayVar(&disks, "disk", nil, "extra disk NAME=SIZE (created) or NAME=FILE (attached, e.g. a CIDATA ISO), repeatable; the guest sees /dev/disk/by-id/virtio-NAME")
	f.StringVar(&cfg.Net, "net", "", "user network range, e.g. 10.0.3.0/24 (guest .15, host .2; default 10.0.2.0/24)")
	f.StringArrayVar(&forwards, "forward", nil, "forward host TCP port to guest port HOST:GUEST (repeatable)")
	f.StringVar(&accel, "accel", "", "auto, kvm or tcg (default $KILN_ACCEL or auto)")
	f.DurationVar(&timeout, "timeout", 0, "stop the VM after this long (default none; 15m with --until-firstboot)")
	f.StringVar(&until, "until", "", "stop once a console line matches this regular expression")
	f.BoolVar(&untilBoot, "until-firstboot", false, "stop once kiln-init prints its first-boot status line; fail if it failed")
	f.BoolVar(&cfg.Snapshot, "snapshot", false, "leave IMAGE unchanged (writes go to a throwaway overlay)")
	f.IntVar(&cfg.MemoryMB, "memory", 2048, "guest memory in MiB")
	f.IntVar(&cfg.CPUs, "cpus", 2, "guest CPUs")
	f.StringVar(&cfg.Append, "append", "", "extra kernel arguments, e.g. 'kiln.config.url=http://10.0.2.2:8080/${mac}.ign' (boots the image's kernel directly)")
	f.StringVar(&cfg.WorkDir, "workdir", "", "directory for the UEFI variable store and created disks (default: a temp dir)")
	return cmd
}

// nodeConfig checks a node config the way kiln-init will (so mistakes show before a boot) and
// returns the file to pass through fw_cfg: Butane YAML is translated to Ignition JSON in dir.
func nodeConfig(path, dir string) (string, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("--config: %w", err)
	}
	c, err := config.Parse(raw)
	if err != nil {
		return "", fmt.Errorf("--config %s: %w", path, err)
	}
	if err := c.Validate(); err != nil {
		return "", fmt.Errorf("--config %s: %w", path, err)
	}
	trimmed := bytes.TrimSpace(raw)
	if len(trimmed) == 0 || trimmed[0] == '{' || bytes.HasPrefix(raw, []byte{0x1f, 0x8b}) {
		return path, nil // Ignition JSON (or gzip'd): passed as is
	}
	ign, err := config.TranslateButane(raw)
	if err != nil {
		return "", fmt.Errorf("--config %s: %w", path, err)
	}
	out := filepath.Join(dir, "config.ign")
	if err := os.WriteFile(out, ign, 0o600); err != nil {
		return "", err
	}
	return out, nil
}
