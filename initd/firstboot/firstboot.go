// Package firstboot is `kiln-init firstboot`, the oneshot service that configures a node on
// its first boot, in the order the data flows: sources ⇒ config (Ignition v3 / Butane, merged
// over the image's default; Run, loadConfig) ⇒ plan (a task graph: plan.go, etcd.go,
// kube.go) ⇒ apply (task.Run) ⇒ report (the Status at nodeimage.StatusPath, printed by
// `kiln-init status`). Every task checks before it acts, so a re-run (or a boot after a
// power cut) converges to the same state; once a first boot has succeeded, later boots
// change nothing. RegisterDNS, `kiln-init dns`, publishes the node's cluster names at every
// boot from the node config first boot put in place.
package firstboot

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kilnproject/kiln/initd/config"
	"github.com/kilnproject/kiln/initd/source"
	"github.com/kilnproject/kiln/initd/systemd"
	"github.com/kilnproject/kiln/initd/task"
	"github.com/kilnproject/kiln/internal/cmdline"
	"github.com/kilnproject/kiln/internal/nodeimage"
	"github.com/kilnproject/kiln/internal/poll"
)

// Options configure Run. The zero value works on a real node.
type Options struct {
	// Root is the node's root directory; "" means "/". Tests use a temporary directory.
	Root string
	// Cmdline is the kernel command line; "" reads /proc/cmdline.
	Cmdline string
	// Platform overrides kiln.platform= from the command line (and the image's platform).
	Platform string
	// Providers are the config sources, asked in this order; nil means
	// source.ForPlatform(platform).
	Providers []source.Provider
	// SourceTimeout bounds each provider; 0 means 3 minutes (the URL source retries within it).
	SourceTimeout time.Duration
	// TaskTimeout bounds each task attempt; 0 means the task runner's default.
	TaskTimeout time.Duration
	// Force runs the tasks even when an earlier first boot succeeded (to prove or repair).
	Force bool
	// PreflightIgnore names preflight checks whose failure is reported but does not stop the
	// Kubernetes tasks (kubeadm's --ignore-preflight-errors).
	PreflightIgnore []string
	// Systemctl runs systemctl with args on the live system. nil runs /usr/bin/systemctl
	// when Root is "/" and does nothing otherwise.
	Systemctl func(ctx context.Context, args ...string) error
	// Rebooter reboots the machine once the config's kernelArguments are written into its
	// boot entry; nil asks systemd, through Systemctl.
	Rebooter Rebooter
	// Networkctl runs networkctl with args on the live system and returns its output; nil
	// runs networkctl when Root is "/" and does nothing otherwise.
	Networkctl func(ctx context.Context, args ...string) (string, error)
	// Facts adjusts fact gathering (tests point it at fake /proc and /sys trees). Its SysRoot
	// also lists the disks for the ESP, and its ProcRoot gives the boot id.
	Facts FactsOptions
	// ESP is a directory holding the EFI system partition's files, where the config's
	// kernelArguments go (tests); "" finds the partition on the disk the node booted from
	// (root=PARTUUID=), listing disks in Facts.SysRoot's block/ and opening them in DevDir.
	ESP string
	// DevDir holds the device nodes; "" means /dev.
	DevDir string
	// Log receives progress; nil discards it.
	Log *slog.Logger
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Version is kiln-init's version, recorded in the status.
	Version string
	// Notify reports progress to systemd (sd_notify STATUS=); nil means task.Notify.
	Notify func(state string) error
}

// FactsOptions are the fact-gathering inputs tests replace.
type FactsOptions struct {
	ProcRoot, SysRoot string
	// Addrs lists an interface's addresses; nil asks the kernel.
	Addrs func(iface string) ([]netip.Prefix, error)
	// AddressWait bounds how long first boot waits, in all, for the node's address (DHCP
	// may answer well after first boot started) and other facts tasks lack; 0 means
	// DefaultAddressWait.
	AddressWait time.Duration
}

// DefaultAddressWait is how long first boot waits for a worker's, control plane's or etcd
// node's address (kubelet, the certificates and etcd's manifest need one) before it fails,
// naming the missing address.
const DefaultAddressWait = 90 * time.Second

// NoSource is the status source when no provider had a config.
const NoSource = "none"

// Run performs the first boot. When an earlier run succeeded (and not Force) it returns that
// run's status with Skipped set and touches nothing but the status file's mode (see
// StatusMode). Otherwise it gets the config, runs the task graph, writes the status (ok or
// failed) and syncs. On failure it returns the failed status together with the error, so
// the caller can print Status.Line in every case (the status is nil only if the root
// cannot be opened).
func Run(ctx context.Context, opts Options) (*Status, error) {
	opts = withDefaults(opts)
	if fi, err := os.Stat(opts.Root); err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("firstboot: root %s is not a directory (%v)", opts.Root, err)
	}
	prev, rerun := previousRun(opts)
	if prev != nil {
		prev.Skipped = true
		opts.Log.Info("first boot already done", "finished", prev.Finished, "source", prev.Source)
		if err := tightenStatus(opts.Root); err != nil {
			return prev, err
		}
		return prev, nil
	}
	st := &Status{Started: opts.Now().UTC(), Files: []FileStatus{}, Version: opts.Version}
	err := finish(ctx, opts, st, run(ctx, opts, st, rerun))
	if err == nil && st.State == StateRebooting {
		err = reboot(ctx, opts, st)
	}
	return st, err
}

// Rebooter reboots the machine.
type Rebooter interface {
	// Reboot asks for a reboot and returns without waiting for it; why says what for.
	Reboot(ctx context.Context, why string) error
}

// systemdReboot is the Rebooter of a live node: systemctl reboot --no-block, so that first
// boot's service ends before the shutdown stops it.
type systemdReboot struct {
	systemctl func(ctx context.Context, args ...string) error
}

func (s systemdReboot) Reboot(ctx context.Context, _ string) error {
	return s.systemctl(ctx, "reboot", "--no-block")
}

// reboot asks for the reboot the kernel arguments first boot wrote need (st records them):
// the next boot runs first boot again with them in effect. On failure it records it.
func reboot(ctx context.Context, opts Options, st *Status) error {
	err := opts.Rebooter.Reboot(ctx, "kernel arguments "+st.KernelArguments.change())
	if err == nil {
		return nil
	}
	err = fmt.Errorf("reboot for the kernel arguments written to %s: %w", st.KernelArguments.Entry, err)
	st.State, st.Error = StateFailed, err.Error()
	if werr := writeStatus(ctx, opts.Root, st); werr != nil {
		err = errors.Join(err, fmt.Errorf("record first-boot status: %w", werr))
	}
	opts.Log.Error("first boot failed", "error", err)
	return err
}

// previousRun reads the status an earlier first boot left: done is that status when the
// boot succeeded (and opts.Force does not ask for a run all the same); rerun says whether
// an earlier boot ran at all.
func previousRun(opts Options) (done *Status, rerun bool) {
	prev, err := ReadStatus(opts.Root)
	switch {
	case err == nil && prev.State == StateOK && !opts.Force:
		return prev, true
	case err == nil && prev.State == StateRebooting:
		opts.Log.Info("first boot goes on after its reboot for the kernel arguments")
	case err == nil && prev.State != StateOK:
		opts.Log.Info("previous first boot did not succeed; running again", "state", prev.State, "error", prev.Error)
	case err != nil && !statusMissing(err):
		opts.Log.Warn("unreadable first-boot status; running again", "error", err)
	}
	return nil, err == nil
}

// finish completes st with runErr's outcome, records it (see writeStatus), syncs and tells
// systemd the console line. It returns runErr joined with a failure to record it.
func finish(ctx context.Context, opts Options, st *Status, runErr error) error {
	st.Finished = opts.Now().UTC()
	st.DurationMS = st.Finished.Sub(st.Started).Milliseconds()
	switch {
	case runErr != nil:
		st.State, st.Error = StateFailed, runErr.Error()
	case st.State != StateRebooting:
		st.State = StateOK
	}
	if err := writeStatus(ctx, opts.Root, st); err != nil {
		err = fmt.Errorf("record first-boot status: %w", err)
		if runErr == nil {
			st.State, st.Error = StateFailed, err.Error()
		}
		runErr = errors.Join(runErr, err)
	}
	unix.Sync()
	_ = opts.Notify("STATUS=" + st.Line())
	if runErr != nil {
		opts.Log.Error("first boot failed", "error", runErr)
		return runErr
	}
	if st.State == StateRebooting {
		opts.Log.Info("first boot reboots for the kernel arguments; it goes on after the reboot", "entry", st.KernelArguments.Entry)
		return nil
	}
	opts.Log.Info("first boot done", "source", st.Source, "tasks", st.Summary(), "duration", st.Duration())
	return nil
}

func withDefaults(o Options) Options {
	if o.Root == "" {
		o.Root = "/"
	}
	if o.SourceTimeout == 0 {
		o.SourceTimeout = 3 * time.Minute
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Notify == nil {
		o.Notify = task.Notify
	}
	if o.Networkctl == nil {
		o.Networkctl = networkctl(o.Root)
	}
	if o.Systemctl == nil {
		o.Systemctl = systemctl(o.Root)
	}
	if o.Rebooter == nil {
		o.Rebooter = systemdReboot{o.Systemctl}
	}
	return o
}

// networkctl runs networkctl on the live system (root "/"); elsewhere it does nothing.
func networkctl(root string) func(ctx context.Context, args ...string) (string, error) {
	if root != "/" {
		return func(context.Context, ...string) (string, error) { return "", nil }
	}
	return func(ctx context.Context, args ...string) (string, error) {
		out, err := exec.CommandContext(ctx, "networkctl", args...).CombinedOutput()
		if err != nil {
			return "", fmt.Errorf("networkctl %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
		}
		return string(out), nil
	}
}

// systemctl runs systemctl on the live system (root "/"); elsewhere it does nothing.
func systemctl(root string) func(ctx context.Context, args ...string) error {
	if root != "/" {
		return func(context.Context, ...string) error { return nil }
	}
	return func(ctx context.Context, args ...string) error {
		out, err := exec.CommandContext(ctx, "systemctl", args...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("systemctl %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
		}
		return nil
	}
}

// run gets the config and runs the task graph, filling in st.
func run(ctx context.Context, opts Options, st *Status, rerun bool) error {
	img, err := nodeimage.ReadImage(opts.Root)
	if err != nil {
		return err
	}
	st.Role = img.Role
	kernelLine := kernelCmdline(opts)
	platform := opts.Platform
	if platform == "" {
		platform, _ = cmdline.Parse(kernelLine).Lookup("kiln.platform")
	}
	if platform == "" {
		platform = img.Platform
	}
	st.Platform = platform

	cfg, err := loadConfig(ctx, opts, kernelLine, platform, st)
	if err != nil {
		return err
	}
	// Kernel arguments take effect at boot: the rest waits until the kernel runs with them.
	if err := kernelArguments(ctx, opts, cfg.KernelArgs(), kernelLine, st); err != nil || st.State == StateRebooting {
		return err
	}
	if _, err := systemd.Find(opts.Root, config.SSHUnit); cfg.EnableSSHForKeys(err == nil) {
		opts.Log.Info("enabling the ssh server: the config gives users ssh keys", "unit", config.SSHUnit)
	}
	plan := newPlan(opts, cfg, img.Role)
	if plan.runtime, err = img.Runtime(); err != nil {
		return err
	}
	plan.rerun, plan.platform = rerun, platform
	return runPlan(ctx, plan, st)
}

// kernelCmdline is opts.Cmdline, else /proc/cmdline.
func kernelCmdline(opts Options) string {
	if opts.Cmdline != "" {
		return opts.Cmdline
	}
	b, _ := os.ReadFile(cmdline.ProcPath)
	return string(b)
}

// runPlan runs the plan's tasks, recording a wait for a fact in the status file as it
// begins, and fills in st with what the tasks did and learnt.
func runPlan(ctx context.Context, plan *plan, st *Status) error {
	opts := plan.opts
	wait := opts.Facts.AddressWait
	if wait <= 0 {
		wait = DefaultAddressWait
	}
	rep, err := task.Run(ctx, plan.tasks(), task.Options{
		TaskTimeout: opts.TaskTimeout,
		Log:         opts.Log,
		Notify:      func(s string) { _ = opts.Notify("STATUS=kiln-init: " + s) },
		Facts:       plan.factList(),
		FactWait:    wait,
		Waiting: func(w task.Wait, tasks []task.TaskStatus) {
			// Where `kiln-init status` looks, while first boot waits.
			first := st.Waiting == nil
			st.State, st.Waiting, st.Tasks = StateRunning, &w, tasks
			if err := writeStatus(ctx, opts.Root, st); err != nil && first {
				opts.Log.Warn("record the wait in the first-boot status", "error", err)
			}
		},
	})
	st.Waiting = nil
	if rep != nil {
		st.Tasks, st.Waits = rep.Tasks, rep.Waits
	}
	st.Files = plan.fileStatus()
	if f := plan.facts; f != nil {
		st.Hostname, st.HostnameSource, st.InstanceID, st.Zone = f.Hostname, f.HostnameSource, f.InstanceID, f.Zone
	}
	if plan.node != nil && plan.node.Role != "" {
		st.Role = string(plan.node.Role)
	}
	return err
}

// loadConfig takes the user's config from the first source that has one and merges it over
// the image's default config. No config at all is fine: the image's defaults apply.
func loadConfig(ctx context.Context, opts Options, kernelLine, platform string, st *Status) (*config.Config, error) {
	providers := opts.Providers
	if providers == nil {
		ps, err := platformProviders(ctx, opts, kernelLine, platform)
		if err != nil {
			return nil, err
		}
		providers = ps
	}
	raw, src, err := source.Select(ctx, providers, opts.SourceTimeout)
	if err != nil {
		return nil, err
	}
	var user *config.Config
	get := config.URLGetter(config.FetchOptions{Retry: source.DefaultURLTimeout, Log: opts.Log})
	if len(raw) == 0 {
		st.Source = NoSource
		opts.Log.Info("no config found", "sources", providerNames(providers))
	} else {
		st.Source = src
		opts.Log.Info("config found", "source", src, "bytes", len(raw))
		if user, err = parse(ctx, raw, "config from "+src, get); err != nil {
			return nil, err
		}
	}
	cfg, err := overDefault(ctx, opts.Root, user, src, get)
	if cfg != nil && len(cfg.Referenced) > 0 {
		st.Referenced = cfg.Referenced
		opts.Log.Info("referenced configs followed", "sources", cfg.Referenced)
	}
	return cfg, err
}

// platformProviders are the platform's config sources, once they can answer: cloud
// metadata services once the network is up (the unit does not wait for
// network-online.target, so fw_cfg and CIDATA boots do not wait for DHCP; the URL source
// retries until its own deadline), a CIDATA volume once udev has named it.
func platformProviders(ctx context.Context, opts Options, kernelLine, platform string) ([]source.Provider, error) {
	ps, err := source.ForPlatform(platform, kernelLine, cloudSources())
	if err != nil {
		return nil, err
	}
	switch {
	case cloudNamed(platform) != nil:
		if err := waitForRoute(ctx, "/proc/net/route", 2*time.Minute); err != nil {
			opts.Log.Warn("no default route; asking the metadata service anyway", "error", err)
		}
	case platform == "qemu" || platform == "metal":
		// A CIDATA volume is found through udev's /dev/disk/by-label: let udev finish.
		if opts.Root == "/" {
			if out, err := exec.CommandContext(ctx, "udevadm", "settle", "--timeout=30").CombinedOutput(); err != nil {
				opts.Log.Warn("udevadm settle", "error", err, "output", strings.TrimSpace(string(out)))
			}
		}
	}
	return ps, nil
}

// overDefault merges the user's config (nil: none, src: where it came from) over the
// image's default config at nodeimage.EmbeddedConfigPath; an image without one leaves the user's as it is.
// get fetches what the default config references.
func overDefault(ctx context.Context, root string, user *config.Config, src string, get config.Getter) (*config.Config, error) {
	base, err := os.ReadFile(filepath.Join(root, nodeimage.EmbeddedConfigPath))
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if user == nil {
			return &config.Config{}, nil
		}
		return user, nil
	case err != nil:
		return nil, fmt.Errorf("image default config: %w", err)
	}
	if base, err = source.Decode(base); err != nil {
		return nil, fmt.Errorf("image default config %s: %w", nodeimage.EmbeddedConfigPath, err)
	}
	def, err := parse(ctx, base, "image default config "+nodeimage.EmbeddedConfigPath, get)
	if err != nil {
		return nil, err
	}
	if user == nil {
		return def, nil
	}
	merged := config.Merge(def, user)
	if err := merged.Validate(); err != nil {
		return nil, fmt.Errorf("config from %s merged over the image default: %w", src, err)
	}
	return merged, nil
}

// waitForRoute waits, bounded, until the kernel has an IPv4 default route.
func waitForRoute(ctx context.Context, routes string, limit time.Duration) error {
	err := poll.Until(ctx, poll.Options{What: "a default route", Timeout: limit, Backoff: poll.Constant(250 * time.Millisecond)},
		func(context.Context) (bool, error) { return hasDefaultRoute(routes), nil })
	if err != nil {
		return fmt.Errorf("no default route after %s", limit)
	}
	return nil
}

// hasDefaultRoute reports whether routes (/proc/net/route) has an IPv4 default route.
func hasDefaultRoute(routes string) bool {
	b, err := os.ReadFile(routes)
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n")[1:] {
		if f := strings.Fields(line); len(f) > 2 && f[1] == "00000000" && f[2] != "00000000" {
			return true
		}
	}
	return false
}

// parse parses, validates and renders a config (what names it for errors): the configs it
// references (ignition.config.merge, replace) are fetched with get, as kiln.config.url is.
func parse(ctx context.Context, raw []byte, what string, get config.Getter) (*config.Config, error) {
	c, err := config.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if c, err = c.Render(ctx, config.RenderOptions{Get: get}); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return c, nil
}

func providerNames(ps []source.Provider) []string {
	names := make([]string, len(ps))
	for i, p := range ps {
		names[i] = p.Name()
	}
	return names
}

// hashFile describes a file as the status records it.
func hashFile(root, p string) (FileStatus, error) {
	full := filepath.Join(root, p)
	fi, err := os.Lstat(full)
	if err != nil {
		return FileStatus{}, err
	}
	data, err := os.ReadFile(full)
	if err != nil {
		return FileStatus{}, err
	}
	sum := sha256.Sum256(data)
	return FileStatus{Path: p, SHA256: hex.EncodeToString(sum[:]), Mode: modeString(fi.Mode())}, nil
}

// modeString renders a mode as the octal Unix permission bits, e.g. "0644" or "4755".
func modeString(m fs.FileMode) string {
	bits := uint32(m.Perm())
	if m&fs.ModeSetuid != 0 {
		bits |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		bits |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		bits |= 0o1000
	}
	return fmt.Sprintf("%04o", bits)
}
