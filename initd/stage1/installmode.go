package stage1

import (
	"context"
	"io"
	"log/slog"
	"strings"

	"github.com/kilnproject/kiln/initd/source"
	"github.com/kilnproject/kiln/initd/stage1/install"
	"github.com/kilnproject/kiln/initd/stage1/liveroot"
	"github.com/kilnproject/kiln/initd/stage1/netup"
)

// runInstall brings the network up (unless the image is on the boot medium and no config URL
// is given) and hands the boot (kiln.install.*) to package install, which returns only on
// failure: on success it reboots into the installed disk. The modules that failed to load are
// named under its error: a missing NIC, disk or CD driver is the likely cause.
func runInstall(ctx context.Context, log *slog.Logger, console io.Writer, cl Cmdline, modFailures []moduleError) error {
	_, fromMedium, _ := liveroot.MediumPath(cl.Kiln["install.image_url"])
	_, configURL := cl.Kiln[strings.TrimPrefix(source.CmdlineURLKey, "kiln.")]
	if !fromMedium || configURL {
		lease, err := netup.Up(ctx, log, netup.Options{Timeout: cl.netTimeout})
		if err != nil {
			return withModules(err, modFailures)
		}
		log.Info("network up", "lease", lease.String())
	}
	if err := install.Run(ctx, log, console, cl.Kiln, install.Options{Cmdline: cl.Raw, DiskWait: cl.RootWait, Medium: liveMedium(cl)}); err != nil {
		return withModules(err, modFailures)
	}
	return nil
}
