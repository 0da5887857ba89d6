package main

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/kilnproject/kiln/initd/kube"
	"github.com/kilnproject/kiln/initd/task"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

func newKubeCNICmd(log *slog.Logger) *cobra.Command {
	var root, node string
	var wait time.Duration
	cmd := &cobra.Command{
		Use:   "cni",
		Short: "Write the CNI config once the node has a pod CIDR (kiln-cni.service, after kubelet)",
		Long: `Cni waits (bounded by --wait) until the node's Node object has a pod CIDR and writes the CNI
config for it. It exits 3 when the pod CIDR did not come in time.`,
		Example: `  kiln-init kube cni
  kiln-init kube cni --node worker-1 --wait 5m`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			name := node
			if name == "" {
				var err error
				if name, err = nodeName(root); err != nil {
					return err
				}
			}
			return writeCNI(cmd, kube.CNIOptions{Root: root, NodeName: name, Wait: wait, Log: log})
		},
	}
	f := cmd.Flags()
	f.StringVar(&root, "root", "/", "root of the node's filesystem")
	f.StringVar(&node, "node", "", "the Node's name (default: this node's hostname)")
	f.DurationVar(&wait, "wait", 15*time.Minute, "how long to wait for the node's pod CIDR")
	return cmd
}

// writeCNI runs the cni stage: resolv.conf for kubelet, then the CNI config.
func writeCNI(cmd *cobra.Command, o kube.CNIOptions) error {
	var cidrs []string
	tasks := []task.Task{task.Converge("resolv-conf", nil, func(context.Context) (bool, error) {
		return kube.EnsureResolvConf(o.Root)
	}), kube.ConvergeWithTimeout("cni-config", []string{"resolv-conf"}, o.Wait+time.Minute, func(ctx context.Context) (bool, error) {
		var changed bool
		var err error
		cidrs, changed, err = kube.EnsureCNI(ctx, o)
		return changed, err
	})}
	st, err := kube.RunStage(cmd.Context(), kube.StageCNI, tasks, kube.RunOptions{Root: o.Root, Log: o.Log}, func() string {
		if len(cidrs) == 0 {
			return "kept " + nodeimage.CNIConfPath
		}
		return "podCIDR " + strings.Join(cidrs, ",") + " in " + nodeimage.CNIConfPath
	})
	fmt.Fprintln(cmd.OutOrStdout(), "kiln-init: "+st.Summary())
	return err
}
