package main

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/spf13/cobra"

	"github.com/kilnproject/kiln/initd/config"
	"github.com/kilnproject/kiln/initd/etcdmember"
	"github.com/kilnproject/kiln/initd/kube"
	"github.com/kilnproject/kiln/initd/task"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

func newKubeBootstrapCmd(log *slog.Logger) *cobra.Command {
	var o kube.BootstrapOptions
	var force bool
	cmd := &cobra.Command{
		Use:   "bootstrap [--force]",
		Short: "kubeadm's init phases on a control plane (kiln-control-plane.service, after kubelet)",
		Long: `Bootstrap runs kubeadm's init phases on a control plane: it waits for the API server, then
writes the bootstrap token, RBAC and cluster-info, marks the node and applies the addons.
Once it succeeded it does nothing (--force runs every step again). It exits 3 when the API
server or the node did not come in time.`,
		Example: `  kiln-init kube bootstrap
  kiln-init kube bootstrap --force --api-wait 30m`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.Log = log
			return bootstrap(cmd, o, force)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Root, "root", "/", "root of the node's filesystem")
	f.BoolVar(&force, "force", false, "run every step again even if the bootstrap succeeded (changes nothing on a bootstrapped cluster)")
	f.DurationVar(&o.APIWait, "api-wait", 20*time.Minute, "how long to wait for the API server (an hour when node.yaml names several etcd members, unless set)")
	f.DurationVar(&o.NodeWait, "node-wait", 10*time.Minute, "how long to wait for kubelet to register the node")
	return cmd
}

// haAPIWait is how long the API server of a control plane with several etcd members is
// waited for unless --api-wait says otherwise: its peers may boot much later.
const haAPIWait = time.Hour

// bootstrap runs the control-plane stage and prints how long the control plane took to
// become ready.
func bootstrap(cmd *cobra.Command, o kube.BootstrapOptions, force bool) error {
	w := cmd.OutOrStdout()
	if prev, err := kube.ReadStage(o.Root, kube.StageControlPlane); err == nil && prev.State == kube.StateOK && !force {
		fmt.Fprintf(w, "kiln-init: control plane bootstrapped already (%s)\n", prev.Finished.Format(time.RFC3339))
		return nil
	}
	n, err := config.LoadNodeIn(o.Root)
	if err != nil {
		return err
	}
	if n.Role != config.RoleControlPlane {
		return fmt.Errorf("kube bootstrap: %s says role %s; only a control plane bootstraps the cluster", nodeimage.NodeConfigPath, n.Role)
	}
	if o.NodeName, err = nodeName(o.Root); err != nil {
		return err
	}
	o.APIEndpoint = n.APIEndpoint
	if e := n.Etcd; !e.External && e.Member != "" {
		// A stacked control plane's place among the etcd members picks its pod ranges.
		o.PodCIDRs = kube.ReservedPodCIDRs(n.Kubernetes.PodCIDR, slices.Index(e.Members, e.Member))
	}
	if members := etcdmember.StaticCluster(n); len(members) > 1 {
		// An API server of several etcd members waits for a quorum: the other control
		// planes may boot much later. Say what it waits for, and wait longer.
		o.Waiting = func(ctx context.Context) string { return etcdmember.Probe(ctx, members, 2*time.Second).String() }
		if !cmd.Flags().Changed("api-wait") {
			o.APIWait = haAPIWait
		}
	}
	tasks, err := kube.BootstrapTasks(o)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "kiln-init: control plane bootstrap: waiting for the API server (up to %s)\n", o.APIWait)
	st, err := kube.RunStage(cmd.Context(), kube.StageControlPlane, tasks, kube.RunOptions{Root: o.Root, Log: o.Log},
		func() string { return "node " + o.NodeName })
	if err != nil {
		step := st.FailedTask()
		if step == "" {
			step = "?"
		}
		fmt.Fprintf(w, "kiln-init: control plane bootstrap failed at step %s: %s\n", step, st.Failure())
		return err
	}
	ready := st.Duration().Round(time.Second).String()
	if up, ok := uptime(); ok {
		ready = fmt.Sprintf("%d s", int(up.Seconds()))
	}
	fmt.Fprintf(w, "kiln-init: control plane ready after %s (boot to ready; bootstrap %s, %s)\n",
		ready, st.Duration().Round(time.Second), (&task.Report{Tasks: st.Tasks}).Summary())
	return nil
}
