package stage1

import (
	"context"
	"io"
	"log/slog"

	"github.com/kilnproject/kiln/initd/stage1/install"
	"github.com/kilnproject/kiln/initd/stage1/netup"
)

// runInstall brings the network up and hands the boot (kiln.install.*) to package install,
// which returns only on failure: on success it reboots into the installed disk. The modules
// that failed to load are named under its error: a missing NIC or disk driver is the likely
// cause.
func runInstall(ctx context.Context, log *slog.Logger, console io.Writer, cl Cmdline, modFailures []moduleError) error {
	lease, err := netup.Up(ctx, log, netup.Options{Timeout: cl.netTimeout})
	if err != nil {
		return withModules(err, modFailures)
	}
	log.Info("network up", "lease", lease.String())
	if err := install.Run(ctx, log, console, cl.Kiln, install.Options{Cmdline: cl.Raw, DiskWait: cl.RootWait}); err != nil {
		return withModules(err, modFailures)
	}
	return nil
}
