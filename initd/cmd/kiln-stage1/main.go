// Command kiln-stage1 is kiln-init's stage 1, the initramfs' /init (PID 1): it mounts the
// read-only root and the persistent /var and /etc (or installs the image on a disk, or boots it
// live from the network) and switches root to systemd; package initd/stage1 does the work. It
// is a binary of its own so that the initramfs carries only what stage 1 links (no cloud or
// etcd clients): the node's agent, kiln-init, lives on the root. On the console it speaks as
// kiln-init, so that a boot's lines read the same from the initramfs to the first boot.
package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kilnproject/kiln/initd/stage1"
)

// version is set at build time with -ldflags "-X main.version=…".
var version = "dev"

func main() {
	if !stage1.IsInitramfsInit(os.Getpid(), os.Args[0]) {
		if len(os.Args) == 2 && (os.Args[1] == "version" || os.Args[1] == "--version") {
			fmt.Println(version)
			return
		}
		fmt.Fprintln(os.Stderr, "kiln-stage1 runs only as an initramfs' /init (PID 1), where kiln bake puts it; `kiln-stage1 version` prints its version")
		os.Exit(2)
	}
	runStage1()
}

// trialRebootDelay leaves the failure on the console a while before a trial boot reboots.
const trialRebootDelay = 10 * time.Second

// runStage1 is PID 1. It must never return: a PID 1 that exits panics the kernel and hides why.
func runStage1() {
	console := openConsole()
	log := slog.New(slog.NewTextHandler(console, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		},
	})).With("prog", "kiln-init")
	err := stage1.Run(context.Background(), log, console)
	fmt.Fprintf(console, "kiln-init: stage 1 failed: %v\n", err)
	if entry, trial := stage1.TrialEntry(); trial {
		// An update's slot on trial: the boot loader counts this try only if the machine
		// boots again, and boots the old slot once the tries are used up.
		fmt.Fprintf(console, "kiln-init: this boot tried %s, an update on trial: rebooting in %s so that the try counts\n", entry, trialRebootDelay)
		time.Sleep(trialRebootDelay)
		unix.Sync()
		if err := unix.Reboot(unix.LINUX_REBOOT_CMD_RESTART); err != nil {
			fmt.Fprintf(console, "kiln-init: reboot: %v\n", err)
		}
	}
	fmt.Fprintln(console, "kiln-init: cannot continue the boot; the machine waits here (power it off)")
	for {
		time.Sleep(time.Hour)
	}
}

func openConsole() io.Writer {
	// The kernel gives PID 1 /dev/console as stdin/out/err when the initramfs has the node.
	if f, err := os.OpenFile("/dev/console", os.O_WRONLY, 0); err == nil {
		return f
	}
	return os.Stderr
}
