// Command kiln-init is the one binary kiln puts in every image: PID 1 of the initramfs (stage 1:
// mount the read-only root and the persistent /var and /etc, then switch_root to systemd) and the
// node agent run by systemd (`firstboot`, `status`, `dns`, `kube images|cni|bootstrap`, `etcd`,
// `preflight`). Each verb is one file here.
package main

import (
	"context"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
)

// version is set at build time with -ldflags "-X main.version=…".
var version = "dev"

func main() {
	if isStage1(os.Getpid(), os.Args[0]) {
		runStage1()
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// isStage1 reports whether kiln-init runs as the initramfs' /init: PID 1 started as /init
// (the kernel's argv[0]), whatever the other arguments (the kernel passes unknown command-line
// words on). PID 1 alone is not enough: a container runs kiln-init as its PID 1 too, as the
// controller-manager's init container does with "kube wait-api".
func isStage1(pid int, argv0 string) bool {
	return pid == 1 && filepath.Base(argv0) == "init"
}
