package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/kilnproject/kiln/builder/qemucluster"
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
Kubernetes node: it has no Ready condition, and its etcd's restarts are not in the API.

Then etcd, as its members tell it through their client ports, which up forwards to
127.0.0.1: the membership (started, learner, leader), each running member's own view, and
etcd's counters of slow applies, slow read indexes and leader changes since it started;
and an etcdctl command line that reaches the cluster with the state directory's client
certificate.`,
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
			printEtcd(w, s, st)
			for _, n := range st.Nodes {
				if n.SSH != "" {
					fmt.Fprintf(w, "ssh %s: %s\n", n.Name, n.SSH)
				}
			}
			return nil
		},
	}
	ref.flags(cmd)
	cmd.Flags().StringVarP(&output, "output", "o", "table", "table or json")
	return cmd
}

// printEtcd writes the etcd part of the status: the members, then an etcdctl line.
func printEtcd(w io.Writer, s *qemucluster.State, st qemucluster.Status) {
	e := st.Etcd
	if e == nil {
		return
	}
	fmt.Fprintln(w, "etcd:")
	if e.Error != "" {
		fmt.Fprintf(w, "  membership: %s\n", e.Error)
	}
	for _, m := range e.Members {
		role := "voting"
		if m.Learner {
			role = "learner"
		}
		if m.Leader {
			role += ", leader"
		}
		if !m.Started {
			role += ", not started"
		}
		fmt.Fprintf(w, "  member %-3s %s (%s)\n", orDefault(m.Name, "?"), m.ID, role)
	}
	var eps []string
	for _, n := range st.Nodes {
		if n.EtcdEndpoint == "" {
			continue
		}
		eps = append(eps, n.EtcdEndpoint)
		if v, ok := e.Nodes[n.Name]; ok {
			sl := e.Slow[n.Name]
			fmt.Fprintf(w, "  %-14s %s: %s; slow applies %d, slow read indexes %d, leader changes %d\n",
				n.Name, n.EtcdEndpoint, v, sl.SlowApplies, sl.SlowReadIndexes, sl.LeaderChanges)
		}
	}
	ca, cert, key := s.EtcdClientFiles()
	fmt.Fprintf(w, "  etcdctl --endpoints %s --cacert %s --cert %s --key %s member list\n", strings.Join(eps, ","), ca, cert, key)
}
