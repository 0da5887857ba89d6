package main

import (
	"fmt"
	"log/slog"

	"github.com/spf13/cobra"

	"github.com/kilnproject/kiln/initd/firstboot"
)

func newFirstbootCmd(log *slog.Logger) *cobra.Command {
	var o firstboot.Options
	var ignore string
	cmd := &cobra.Command{
		Use:   "firstboot",
		Short: "Apply the node config (run once by kiln-firstboot.service)",
		Long: `Firstboot configures the node on its first boot: it takes the Ignition config from the first
source that has one (following its ignition.config.merge/replace references), merges it over
the image's default, runs the task graph (users, files,
units, node config, facts, hostname, preflight, templates, etcd volume, PKI, kubelet) and
records the outcome in /var/lib/kiln/status.json. It prints one status line for the console.
An image baked for a role other than worker, control-plane or etcd is a plain node: its graph
stops at the hostname.
Once a first boot has succeeded, later runs change nothing (--force runs the tasks again).
A config with kernelArguments the running kernel lacks has them written into the booted
slot's boot entry: the status is "rebooting", the machine reboots once and the next boot's
first boot goes on with them in effect (a boot that still lacks them after that reboot, as a
direct kernel boot does, fails instead of rebooting again).

It exits 1 when first boot failed and 3 when it gave up waiting (for the node's address, say).`,
		Example: `  kiln-init firstboot
  kiln-init firstboot --force --ignore-preflight=swap,memory`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.Log, o.Version, o.PreflightIgnore = log, version, splitList(ignore)
			st, err := firstboot.Run(cmd.Context(), o)
			if st != nil {
				// One line for the console (the unit sends stdout to journal+console).
				fmt.Fprintln(cmd.OutOrStdout(), st.Line())
			}
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Root, "root", "/", "root of the node's filesystem")
	f.BoolVar(&o.Force, "force", false, "run every task again even if first boot succeeded (changes nothing on a converged node)")
	f.StringVar(&ignore, "ignore-preflight", "", "comma-separated preflight checks whose failure does not stop the Kubernetes tasks")
	return cmd
}
