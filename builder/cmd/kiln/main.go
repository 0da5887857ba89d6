// Command kiln bakes immutable, role-specific Kubernetes node images and boots them in QEMU.
package main

import (
	"context"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	containerdlog "github.com/containerd/log"

	"github.com/spf13/cobra"

	"github.com/kilnproject/kiln/internal/exitcode"
)

// version is set at build time with -ldflags "-X main.version=…".
var version = "dev"

func main() {
	// containerd's libraries, with which the bake lays the image store, log through their own
	// process-wide logger; their warnings (no fs-verity on the bake host's filesystem, say) are
	// about containerd's runtime, not the bake.
	_ = containerdlog.SetLevel("error")
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := execute(ctx, newRoot(), os.Args[1:], os.Stderr)
	stop()
	os.Exit(code)
}

// execute runs root with args, prints an error to stderr and returns kiln's exit code.
func execute(ctx context.Context, root *cobra.Command, args []string, stderr io.Writer) int {
	return exitcode.Run(ctx, root, args, stderr)
}

func newRoot() *cobra.Command {
	var verbose bool
	root := &cobra.Command{
		Use:           "kiln",
		Short:         "Bake immutable Kubernetes node images and boot them",
		Long:          "Kiln bakes immutable, role-specific Kubernetes node images and boots them in QEMU.\n\n" + exitHelp,
		Version:       version,
		SilenceUsage:  true,
		SilenceErrors: true,
		Example: `  # build the default base OS, pin it, bake the worker image and boot it
  make image

  kiln lock images/qemu.yaml
  kiln bake images/qemu.yaml --role worker -o out
  kiln run out/qemu-worker.qcow2 --config node.ign --until-firstboot
  kiln inspect out/qemu-worker.raw`,
		PersistentPreRun: func(cmd *cobra.Command, _ []string) {
			level := slog.LevelInfo
			if verbose {
				level = slog.LevelDebug
			}
			slog.SetDefault(slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: level})))
		},
	}
	root.PersistentFlags().BoolVarP(&verbose, "verbose", "v", false, "log every step")
	root.AddCommand(newBaseCmd(), newLockCmd(), newBakeCmd(), newRunCmd(), newInspectCmd(), newVerifyCmd(), newCacheCmd(), newCheckConfigCmd(), newClusterCmd(), newPublishCmd(), newServeCmd(), newISOCmd())
	return root
}

// exitHelp documents kiln's exit codes and what times out in it.
const exitHelp = exitcode.Help + `: kiln run's --timeout passed before the first-boot
     status line (--until-firstboot) or the --until pattern appeared, or a download or
     registry request ran out of time`

// showHelp is the action of a command that only groups others: it prints the help, and an
// unknown subcommand fails its cobra.NoArgs as a usage error.
func showHelp(cmd *cobra.Command, _ []string) error { return cmd.Help() }
