package install

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"time"

	"golang.org/x/sys/unix"
)

// Run installs as the kernel command line says (kiln holds its kiln.* parameters without the
// prefix; o.Cmdline is the whole line), prints
//
//	kiln-init: installed <image> to <dev> (<n> MiB, sha256 ok); rebooting
//
// on the console, syncs and reboots. It returns only on failure; nothing was written then
// unless the error says the disk no longer boots.
func Run(ctx context.Context, log *slog.Logger, console io.Writer, kiln map[string]string, o Options) error {
	p, err := parseParams(kiln)
	if err != nil {
		return fmt.Errorf("install: %w", err)
	}
	res, err := install(ctx, log, p, o)
	if err != nil {
		return err
	}
	fmt.Fprintln(console, installedLine(res))
	unix.Sync()
	if err := unix.Reboot(unix.LINUX_REBOOT_CMD_RESTART); err != nil {
		return fmt.Errorf("install: reboot: %w", err)
	}
	for { // the kernel is restarting
		time.Sleep(time.Hour)
	}
}

// installedLine is the console line of a finished install; test harnesses wait for it.
func installedLine(r result) string {
	return fmt.Sprintf("kiln-init: installed %s to %s (%d MiB, sha256 ok); rebooting", r.image, r.device, r.bytes>>20)
}
