package main

import (
	"encoding/json"
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"
)

func newClusterStatusCmd() *cobra.Command {
	var (
		ref    clusterRef
		output string
	)
	cmd := &cobra.Command{
		Use:   "status --name NAME",
		Short: "Show each node of a kiln cluster up cluster: VM running, pid, address, first boot, Ready, etcd member, restarts",
		Long: `Status reads the cluster's state directory and shows, per node, whether its QEMU runs (and
its pid, resident memory and CPU time), its address on the cluster link, its API port on
127.0.0.1 (control planes), the outcome of its last first-boot status line on the console,
its Ready condition as the API reports it (empty when no control plane answers), what its
latest boot said of its etcd member (voting, or why not), and how often its kube-system
containers restarted (RESTARTS; the JSON names each container). An etcd node is not a
Kubernetes node: it has no Ready condition, and its etcd's restarts are not in the API.`,
		Example: `  kiln cluster status --name demo
  kiln cluster status --state-dir demo -o json | jq '.nodes[] | select(.ready != "True")'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if output != "" && output != "json" && output != "table" {
				return fmt.Errorf("-o %q: want table or json", output)
			}
			s, err := ref.load()
			if err != nil {
				return err
			}
			st := s.Status(cmd.Context())
			w := cmd.OutOrStdout()
			if output == "json" {
				enc := json.NewEncoder(w)
				enc.SetIndent("", "  ")
				return enc.Encode(st)
			}
			tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NODE\tROLE\tVM\tPID\tADDRESS\tAPI\tREADY\tETCD\tRESTARTS\tRSS\tCPU\tFIRST BOOT")
			for _, n := range st.Nodes {
				vmState, pid, api, rss, cpu, restarts := "stopped", "-", "-", "-", "-", "-"
				if n.Restarts != nil {
					restarts = fmt.Sprint(n.Restarts.Count)
				}
				if n.Running {
					vmState, pid = "running", fmt.Sprint(n.PID)
					rss, cpu = fmt.Sprintf("%dMiB", n.RSSMiB), fmt.Sprintf("%.0fs", n.CPUSeconds)
				}
				if n.APIPort != 0 {
					api = fmt.Sprintf("127.0.0.1:%d", n.APIPort)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", n.Name, n.Role, vmState, pid, n.Address, api,
					orDefault(n.Ready, "-"), orDefault(n.Etcd, "-"), restarts, rss, cpu, orDefault(n.FirstBoot, "-"))
			}
			tw.Flush()
			fmt.Fprintf(w, "kubeconfig: %s\n", st.Kubeconfig)
			if st.APIError != "" {
				fmt.Fprintf(w, "API: %s\n", st.APIError)
			}
			return nil
		},
	}
	ref.flags(cmd)
	cmd.Flags().StringVarP(&output, "output", "o", "table", "table or json")
	return cmd
}
