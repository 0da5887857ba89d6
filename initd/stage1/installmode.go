package stage1

import (
	"context"
	"errors"
	"log/slog"

	"github.com/kilnproject/kiln/initd/stage1/netup"
)

// Installer runs an install boot (kiln.install.*): package install's Run, handed to Run by
// kiln-init's main, since package install builds on stage 1's disk probes. It returns only
// on failure; on success it reboots into the installed disk.
type Installer func(ctx context.Context, log *slog.Logger, cl Cmdline) error

// runInstall brings the network up and hands the boot to install. The modules that failed to
// load are named under its error: a missing NIC or disk driver is the likely cause.
func runInstall(ctx context.Context, log *slog.Logger, cl Cmdline, install Installer, modFailures []moduleError) error {
	if install == nil {
		return errors.New("kernel cmdline: an install boot is not supported by this kiln-init")
	}
	lease, err := netup.Up(ctx, log, netup.Options{Timeout: cl.netTimeout})
	if err != nil {
		return withModules(err, modFailures)
	}
	log.Info("network up", "lease", lease.String())
	if err := install(ctx, log, cl); err != nil {
		return withModules(err, modFailures)
	}
	return nil
}
