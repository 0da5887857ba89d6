package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/kilnproject/kiln/initd/firstboot"
	"github.com/kilnproject/kiln/initd/update"
	"github.com/kilnproject/kiln/internal/exitcode"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

const updateLong = `Update moves the node to a new image in place. It writes the root slot the node did not boot
from (root-a or root-b): the new root image with its dm-verity tree, read back and checked
against the image's root hash; its kernel and initramfs under the ESP's /kiln/<slot>/; and a
boot entry on trial (systemd-boot's boot counting, kiln-<slot>+3.conf) that boots before the
running one. The running slot is never written, and a power cut at any point leaves the old
slot booting.

--from names the bake's <image>-<role>.json, by http(s) URL (kiln serve serves each image of its
machines.yaml at /images/<image>-<role>.json; any static server of the output directory does) or
path; the kernel, initramfs and root image are read from the pxe directory beside
it, so the image must be baked with the pxe format. Before anything is written the image is
refused if it is of another role or platform, of a bake↔boot contract this kiln-init does not
know, older than the running image (unless --allow-downgrade), too big for the slot, or the
image already running.

After the reboot the new slot is on trial: kiln-update-check.service asks the node's health
(first boot done; kubelet running where the image has Kubernetes; a control plane's API server
ready) and then blesses the entry. A slot that does not come up (stage 1 fails, the kernel
panics, or the health check does not pass within its bound) reboots; after 3 tries systemd-boot
boots the old slot, and "kiln-init update status" reports the rollback. /var, the /etc overlay,
the etcd disk and the node's identity are on the data partition and survive; first boot does
not run again.`

func newUpdateCmd(log *slog.Logger) *cobra.Command {
	var o struct {
		from                   string
		reboot, allowDowngrade bool
		tries                  int
	}
	cmd := &cobra.Command{
		Use:   "update --from URL|FILE",
		Short: "Write a new image to the other root slot and boot it on trial (A/B, with rollback)",
		Long:  updateLong,
		Example: `  kiln-init update --from http://10.0.0.1:8080/images/qemu-worker.json --reboot
  kiln-init update --from /var/tmp/out/qemu-worker.json
  kiln-init update status
  kiln-init update rollback --reboot`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.from == "" {
				return exitcode.Usagef("update: --from is required (the URL or path of the bake's <image>-<role>.json)")
			}
			if o.tries < 1 || o.tries > 9 {
				return exitcode.Usagef("update: --tries %d: want 1 to 9", o.tries)
			}
			return runUpdate(cmd.Context(), log, cmd.OutOrStdout(), o.from, o.reboot, update.Options{AllowDowngrade: o.allowDowngrade, Tries: o.tries})
		},
	}
	cmd.Flags().StringVar(&o.from, "from", "", "URL or path of the bake's <image>-<role>.json")
	cmd.Flags().BoolVar(&o.reboot, "reboot", false, "reboot into the new slot once it is written")
	cmd.Flags().BoolVar(&o.allowDowngrade, "allow-downgrade", false, "take an image created before the running one")
	cmd.Flags().IntVar(&o.tries, "tries", update.DefaultTries, "boots the new slot gets before the boot loader gives up on it")
	cmd.AddCommand(newUpdateStatusCmd(), newUpdateRollbackCmd(), newUpdateCheckCmd(log))
	return cmd
}

// withDisk finds the boot disk, mounts its ESP and runs fn.
func withDisk(fn func(update.Disk) error) error {
	disk, espDev, err := update.HostSystem.FindDisk()
	if err != nil {
		return err
	}
	return withESP(disk, espDev, fn)
}

// withESP mounts the ESP espDev of disk and runs fn.
func withESP(disk update.Disk, espDev string, fn func(update.Disk) error) (err error) {
	dir, unmount, err := update.MountESP(espDev)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, unmount()) }()
	disk.ESPDir = dir
	return fn(disk)
}

func runUpdate(ctx context.Context, log *slog.Logger, w io.Writer, from string, reboot bool, o update.Options) error {
	src, err := update.NewSource(from, &http.Client{})
	if err != nil {
		return exitcode.Usagef("%v", err)
	}
	md, err := src.Metadata(ctx)
	if err != nil {
		return err
	}
	run, err := update.ReadRunning("/", update.HostSystem.Cmdline)
	if err != nil {
		return err
	}
	err = withDisk(func(disk update.Disk) error {
		if err := update.Check(md, run, disk.Other(), o); err != nil {
			return err
		}
		res, err := update.Apply(ctx, log, src, md, disk, "/", o)
		if err != nil {
			return fmt.Errorf("update slot %s: %w (the slot has no boot entry: the node keeps booting slot %s)", disk.Other().Name, err, disk.Booted)
		}
		fmt.Fprintf(w, "slot %s (%s) now holds %s-%s (root hash %s); entry %s boots next, on trial\n",
			res.Slot.Letter, res.Slot.Device, md.Name, md.Role, res.RootHash, res.Entry)
		fmt.Fprintf(w, "wrote %d bytes in %s\n", res.Wrote, res.Took.Round(time.Millisecond))
		return nil
	})
	if errors.Is(err, update.ErrUpToDate) {
		fmt.Fprintln(w, err)
		return nil
	}
	if err != nil || !reboot {
		return err
	}
	return systemctl("reboot")
}

func systemctl(args ...string) error {
	out, err := exec.Command("systemctl", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("systemctl %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

func newUpdateStatusCmd() *cobra.Command {
	var format string
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the root slots, which boots next, tries left and the last update or rollback",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(format); err != nil {
				return err
			}
			return withDisk(func(disk update.Disk) error {
				st, err := update.Read(disk, "/")
				if err != nil {
					return err
				}
				if format == "json" {
					enc := json.NewEncoder(cmd.OutOrStdout())
					enc.SetIndent("", "  ")
					return enc.Encode(st)
				}
				printUpdateStatus(cmd.OutOrStdout(), st)
				return nil
			})
		},
	}
	outputFlag(cmd, &format)
	return cmd
}

func printUpdateStatus(w io.Writer, st update.Status) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SLOT\tDEVICE\tIMAGE\tCREATED\tKILN\tENTRY\tTRIES LEFT\tSTATE")
	for _, s := range st.Slots {
		entry, tries, state := "-", "-", []string{}
		if s.Entry != nil {
			entry = s.Entry.File
			switch {
			case s.Entry.Bad():
				tries, state = "0", append(state, "failed")
			case s.Entry.Counting:
				tries, state = fmt.Sprint(s.Entry.TriesLeft), append(state, "on trial")
			default:
				state = append(state, "good")
			}
		} else {
			state = append(state, "no entry")
		}
		if s.Booted {
			state = append(state, "booted")
		}
		if s.Default {
			state = append(state, "boots next")
		}
		created := "-"
		if !s.Created.IsZero() {
			created = s.Created.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.Letter, s.Device, orDash(s.Image), created, orDash(s.Kiln), entry, tries, strings.Join(state, ", "))
	}
	tw.Flush()
	if l := st.Last; l != nil {
		fmt.Fprintf(w, "\nlast update: slot %s from slot %s, %s (root hash %s), written %s from %s\n",
			l.Slot, l.From, l.Image, l.RootHash, l.Written.Format(time.RFC3339), l.Source)
		if !l.Blessed.IsZero() {
			fmt.Fprintf(w, "  found good %s\n", l.Blessed.Format(time.RFC3339))
		}
		if l.LastFailure != "" {
			fmt.Fprintf(w, "  last failed try: %s\n", l.LastFailure)
		}
		if r := l.RolledBack; r != nil {
			fmt.Fprintf(w, "  rolled back to slot %s at %s: %s\n", r.To, r.At.Format(time.RFC3339), r.Reason)
		}
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func newUpdateRollbackCmd() *cobra.Command {
	var reboot bool
	cmd := &cobra.Command{
		Use:   "rollback",
		Short: "Make the other root slot boot next again",
		Long: `Rollback makes the slot the node did not boot from the default again (its entry gets the
highest version); the booted slot's entry stays, below it. A slot without an entry, or whose
entry ran out of tries, is refused.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			err := withDisk(func(disk update.Disk) error {
				entry, err := update.RollBack(disk, "/", "kiln-init update rollback", time.Now)
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "slot %s (entry %s) boots next\n", disk.Other().Letter, entry)
				return nil
			})
			if err != nil || !reboot {
				return err
			}
			return systemctl("reboot")
		},
	}
	cmd.Flags().BoolVar(&reboot, "reboot", false, "reboot into it")
	return cmd
}

// healthBound is how long a slot on trial has to become healthy.
const healthBound = 10 * time.Minute

func newUpdateCheckCmd(log *slog.Logger) *cobra.Command {
	var noReboot bool
	cmd := &cobra.Command{
		Use:    "check",
		Short:  "At boot: bless a slot on trial once the node is healthy, reboot it if not, report a rollback",
		Hidden: true, // kiln-update-check.service runs it
		Args:   noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			disk, espDev, err := update.HostSystem.FindDisk()
			if err != nil {
				log.Info("no slots to check", "why", err)
				return nil
			}
			run, err := update.ReadRunning("/", update.HostSystem.Cmdline)
			if err != nil {
				return err
			}
			var checkErr error
			err = withESP(disk, espDev, func(disk update.Disk) error {
				out, err := update.BootCheck(cmd.Context(), log, disk, "/", nodeHealth("/", run.Image), healthBound, time.Now)
				if out.RolledBack != nil {
					fmt.Fprintf(cmd.OutOrStdout(), "kiln-init: update rolled back: booted slot %s again: %s\n", out.RolledBack.To, out.RolledBack.Reason)
				}
				if out.Blessed {
					fmt.Fprintf(cmd.OutOrStdout(), "kiln-init: slot %s is good: entry %s blessed\n", disk.Booted, out.Entry)
				}
				checkErr = err
				return nil
			})
			if err != nil {
				return err
			}
			if checkErr != nil {
				fmt.Fprintf(cmd.OutOrStdout(), "kiln-init: %v\n", checkErr)
				if !noReboot {
					fmt.Fprintln(cmd.OutOrStdout(), "kiln-init: rebooting so the boot loader counts the failed try")
					return systemctl("reboot")
				}
			}
			return checkErr
		},
	}
	cmd.Flags().BoolVar(&noReboot, "no-reboot", false, "do not reboot a slot on trial that is not healthy")
	return cmd
}

// nodeHealth is what makes a booted node good: first boot done, kubelet running where the
// image has Kubernetes, and on a control plane the API server ready.
func nodeHealth(root string, md *nodeimage.Metadata) update.Health {
	return func(ctx context.Context) error {
		st, err := firstboot.ReadStatus(root)
		if err != nil {
			return fmt.Errorf("first boot: %w", err)
		}
		if st.State != firstboot.StateOK {
			return fmt.Errorf("first boot is %s, not ok", st.State)
		}
		if md.Kubernetes == nil {
			return nil
		}
		if out, err := exec.CommandContext(ctx, "systemctl", "is-active", "kubelet.service").Output(); err != nil {
			return fmt.Errorf("kubelet.service is %s", strings.TrimSpace(string(out)))
		}
		if md.Role != "control-plane" {
			return nil
		}
		return apiReady(ctx, root)
	}
}

// apiReady asks the local API server's /readyz, trusting the cluster CA.
func apiReady(ctx context.Context, root string) error {
	ca, err := os.ReadFile(filepath.Join(root, nodeimage.KubeCACertPath))
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://127.0.0.1:6443/readyz", nil)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("API server: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("API server /readyz answered %s", resp.Status)
	}
	return nil
}
