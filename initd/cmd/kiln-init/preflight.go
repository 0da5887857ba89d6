package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/kilnproject/kiln/initd/firstboot/preflight"
	"github.com/kilnproject/kiln/internal/exitcode"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

func newPreflightCmd() *cobra.Command {
	var role, format, skip, ignore string
	var o preflight.Options
	cmd := &cobra.Command{
		Use:   "preflight --role control-plane|worker|etcd",
		Short: "Run kubeadm's preflight checks for a role and print them",
		Long: `Preflight checks that this machine can become a node of the role and prints one line per
check. It exits 1 when an error-level check fails (--ignore makes a check's failure only
reported).`,
		Example: `  kiln-init preflight --role worker
  kiln-init preflight --role control-plane --ignore swap -o json`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if role == "" {
				return exitcode.Usagef("preflight: --role is required (control-plane, worker or etcd)")
			}
			r, err := preflight.ParseRole(role)
			if err != nil {
				return exitcode.Usagef("preflight: --role: %w", err)
			}
			if err := checkOutput(format); err != nil {
				return err
			}
			o.Skip, o.Ignore = splitList(skip), splitList(ignore)
			rep, err := preflight.Run(cmd.Context(), r, o)
			if err != nil {
				return err
			}
			if err := rep.Print(cmd.OutOrStdout(), format); err != nil {
				return fmt.Errorf("preflight: print: %w", err)
			}
			return rep.Err()
		},
	}
	f := cmd.Flags()
	f.StringVar(&role, "role", "", "the node's role: control-plane, worker or etcd (required)")
	outputFlag(cmd, &format)
	f.StringVar(&o.Root, "root", "/", "the node's root directory")
	f.StringVar(&o.CRISocket, "cri-socket", nodeimage.ContainerdSocket, "the container runtime's socket")
	f.StringVar(&skip, "skip", "", "comma-separated checks not to run")
	f.StringVar(&ignore, "ignore", "", `comma-separated checks whose failure is only reported ("all" for every check)`)
	return cmd
}
