// Command kiln-init is the node agent kiln puts on every image's root, run by systemd
// (`firstboot`, `status`, `dns`, `kube images|cni|bootstrap`, `etcd`, `preflight`, `update`).
// Each verb is one file here. The initramfs' /init is kiln-stage1 (initd/cmd/kiln-stage1), a
// binary of its own so that stage 1 does not carry the agent's cloud and etcd clients.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/kilnproject/kiln/initd/stage1"
)

// version is set at build time with -ldflags "-X main.version=…".
var version = "dev"

func main() {
	if stage1.IsInitramfsInit(os.Getpid(), os.Args[0]) {
		wrongInit()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// wrongInit is kiln-init started as an initramfs' /init, where kiln-stage1 belongs: it says
// so and waits, since a PID 1 that exits panics the kernel and hides why.
func wrongInit() {
	console := os.Stderr
	if f, err := os.OpenFile("/dev/console", os.O_WRONLY, 0); err == nil {
		console = f
	}
	fmt.Fprintln(console, "kiln-init: stage 1 failed: this initramfs' /init is kiln-init, the node agent; stage 1 is kiln-stage1 (rebake the image: kiln bake puts kiln-stage1 there); the machine waits here (power it off)")
	for {
		time.Sleep(time.Hour)
	}
}
