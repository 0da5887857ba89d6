// Command kiln-init is the one binary kiln puts in every image: PID 1 of the initramfs (stage 1:
// mount the read-only root and the persistent /var and /etc, then switch_root to systemd) and the
// node agent run by systemd (`firstboot`, `status`, `dns`, `kube images|cni|bootstrap`,
// `preflight`). Each verb is one file here.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

// version is set at build time with -ldflags "-X main.version=…".
var version = "dev"

func main() {
	// PID 1 is the initramfs' /init: stage 1, whatever the arguments.
	if os.Getpid() == 1 {
		runStage1()
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
