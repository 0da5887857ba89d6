package main

import (
	"fmt"
	"log/slog"

	"github.com/spf13/cobra"

	"github.com/kilnproject/kiln/initd/firstboot"
)

func newDNSCmd(log *slog.Logger) *cobra.Command {
	var root string
	cmd := &cobra.Command{
		Use:   "dns",
		Short: "Publish this node's cluster names (kiln-dns.service, every boot)",
		Long: `Dns publishes this node's cluster names (etcd-<member>.internal…, api.internal…) with the DNS
provider node.yaml names. It checks before it writes, so an unchanged node sends nothing,
and retries with backoff until it is stopped; kiln-init status shows its state.`,
		Example: `  kiln-init dns`,
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := firstboot.RegisterDNS(cmd.Context(), root, log)
			if err == nil && st.State != "" {
				fmt.Fprintln(cmd.OutOrStdout(), "kiln-init: dns "+st.String())
			}
			return err
		},
	}
	cmd.Flags().StringVar(&root, "root", "/", "root of the node's filesystem")
	return cmd
}
