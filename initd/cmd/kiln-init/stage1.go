package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/kilnproject/kiln/initd/stage1"
)

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
