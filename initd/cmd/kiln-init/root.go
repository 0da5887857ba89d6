package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kilnproject/kiln/internal/exitcode"
)

// exitHelp documents kiln-init's exit codes and what times out in it.
const exitHelp = exitcode.Help + `: the node's address, the API server, the pod CIDR,
     a step's deadline`

// run is kiln-init outside the initramfs: it runs the verb args name and returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	root := newRoot(stderr)
	root.SetOut(stdout)
	root.SetErr(stderr)
	return exitcode.Run(ctx, root, args, stderr)
}

func newRoot(stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:   "kiln-init",
		Short: "The kiln node agent",
		Long: `kiln-init is the kiln node agent on the image's root: the image's units run its verbs.
Stage 1 (the initramfs' /init: mount the read-only root and the persistent /var and /etc, then
hand over to systemd) is kiln-stage1, a binary of its own.

` + exitHelp,
		Example: `  kiln-init firstboot            # kiln-firstboot.service, once
  kiln-init status               # what first boot and the Kubernetes steps did
  kiln-init status -o json | jq .tasks`,
		Version:       version,
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          cobra.ArbitraryArgs,
		RunE:          needVerb,
	}
	root.SetVersionTemplate("{{.Version}}\n")
	root.CompletionOptions.DisableDefaultCmd = true // a node agent run by units: nothing to complete
	log := slog.New(slog.NewTextHandler(stderr, nil))
	root.AddCommand(newFirstbootCmd(log), newStatusCmd(), newDNSCmd(log), newKubeCmd(log), newEtcdCmd(log),
		newPreflightCmd(), newUpdateCmd(log), newVersionCmd())
	return root
}

// needVerb is the RunE of a command that only groups verbs: called without one, or with an
// unknown one, it is a usage error.
func needVerb(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		cmd.SetOut(cmd.ErrOrStderr())
		_ = cmd.Usage()
		return exitcode.Usagef("%s: missing verb", cmd.CommandPath())
	}
	return exitcode.Usagef("unknown verb %q for %s", args[0], cmd.CommandPath())
}

// noArgs is cobra.NoArgs as a usage error.
func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return exitcode.Usagef("%s: unexpected argument %q", cmd.CommandPath(), args[0])
	}
	return nil
}

// outputFlag adds -o/--output (table or json) to cmd.
func outputFlag(cmd *cobra.Command, format *string) {
	cmd.Flags().StringVarP(format, "output", "o", "table", "output format: table or json")
}

// checkOutput is a usage error for a format other than table and json.
func checkOutput(format string) error {
	if format != "table" && format != "json" {
		return exitcode.Usagef("-o: unknown output format %q (want table or json)", format)
	}
	return nil
}

// splitList splits a comma-separated flag value, dropping blanks.
func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "version",
		Short:   "Print kiln-init's version",
		Example: "  kiln-init version\n  kiln-init --version",
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fmt.Fprintln(cmd.OutOrStdout(), version)
			return nil
		},
	}
}
