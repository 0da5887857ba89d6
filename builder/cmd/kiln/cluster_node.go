package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"
)

func newClusterStopCmd() *cobra.Command {
	var ref clusterRef
	cmd := &cobra.Command{
		Use:   "stop NODE --name NAME",
		Short: "Power off one node's VM (its disks, the etcd disk too, are kept)",
		Long: `Stop ends the node's QEMU (SIGTERM, which flushes its disks; SIGKILL after 30 s), as a power
cut: the guest is not shut down. Its disks stay in the state directory; kiln cluster start
boots it again from them.`,
		Example: `  kiln cluster stop demo-cp-2 --name demo`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := ref.load()
			if err != nil {
				return err
			}
			if err := s.StopNode(args[0], 30*time.Second); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s stopped\n", args[0])
			return nil
		},
	}
	ref.flags(cmd)
	return cmd
}

func newClusterStartCmd() *cobra.Command {
	var (
		ref     clusterRef
		wait    bool
		timeout time.Duration
	)
	cmd := &cobra.Command{
		Use:   "start [NODE...] --name NAME",
		Short: "Boot stopped nodes again from their own disks (all stopped nodes without NODE)",
		Long: `Start boots each named node (every node when none is named) from the disks it had: a control
plane keeps its etcd disk and rejoins as the member it was. Running nodes are left alone.
With --wait it waits until the nodes are Ready; starting every node with --wait starts the
control planes one after another and the workers once the control planes are Ready, as up
does.`,
		Example: `  kiln cluster start demo-cp-2 --name demo --wait
  kiln cluster start --name demo     # every stopped node`,
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := ref.load()
			if err != nil {
				return err
			}
			if len(args) == 0 {
				var all []string
				for _, n := range s.Nodes {
					all = append(all, n.Name)
				}
				if wait {
					// As up: control planes one after another, workers once they are Ready.
					return s.StartAll(cmd.Context(), timeout, newProgressPrinter(cmd.OutOrStdout(), all).report)
				}
				args = all
			}
			for _, n := range args {
				if _, err := s.Node(n); err != nil {
					return err
				}
			}
			p := newProgressPrinter(cmd.OutOrStdout(), args)
			for _, n := range args {
				if err := s.StartNode(cmd.Context(), n); err != nil {
					return err
				}
				p.report(n, "started")
			}
			if !wait {
				return nil
			}
			return s.WaitReadyFor(cmd.Context(), args, timeout, p.report)
		},
	}
	ref.flags(cmd)
	cmd.Flags().BoolVar(&wait, "wait", false, "wait until the nodes are Ready")
	cmd.Flags().DurationVar(&timeout, "timeout", 30*time.Minute, "how long --wait waits")
	return cmd
}

func newClusterReplaceCmd() *cobra.Command {
	var (
		ref   clusterRef
		start bool
	)
	cmd := &cobra.Command{
		Use:   "replace NODE --name NAME",
		Short: "Replace a node with a fresh VM: a new disk from the baked image and, on a control plane, a blank etcd disk",
		Long: `Replace stops the node and throws its disks away: it gets a new copy-on-write disk on the
baked image, fresh UEFI variables and, on a control plane, a blank etcd disk, with the same
name, address and config. Booted (at once, unless --start=false), it is a new machine: a
control plane finds its etcd disk blank in a cluster that exists and rejoins as the same
member (kiln-init removes the stale member and adds itself).`,
		Example: `  kiln cluster replace demo-cp-3 --name demo`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := ref.load()
			if err != nil {
				return err
			}
			if err := s.ReplaceNode(cmd.Context(), args[0]); err != nil {
				return err
			}
			if !start {
				fmt.Fprintf(cmd.OutOrStdout(), "%s replaced (stopped; kiln cluster start boots it)\n", args[0])
				return nil
			}
			if err := s.StartNode(cmd.Context(), args[0]); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s replaced and started\n", args[0])
			return nil
		},
	}
	ref.flags(cmd)
	cmd.Flags().BoolVar(&start, "start", true, "boot the new machine")
	return cmd
}

func newClusterDownCmd() *cobra.Command {
	var (
		ref  clusterRef
		keep bool
	)
	cmd := &cobra.Command{
		Use:   "down --name NAME",
		Short: "Stop every VM of a kiln cluster up cluster and remove its state directory",
		Example: `  kiln cluster down --name demo
  kiln cluster down --name demo --keep   # stop, keep the disks: kiln cluster start boots them again`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, err := ref.load()
			if err != nil {
				return err
			}
			if err := s.Down(keep); err != nil {
				return err
			}
			if keep {
				fmt.Fprintf(cmd.OutOrStdout(), "cluster %s stopped; its state is kept in %s\n", s.Name, s.Dir)
			} else {
				fmt.Fprintf(cmd.OutOrStdout(), "cluster %s stopped and %s removed\n", s.Name, s.Dir)
			}
			return nil
		},
	}
	ref.flags(cmd)
	cmd.Flags().BoolVar(&keep, "keep", false, "keep the state directory (disks, consoles, kubeconfig)")
	return cmd
}
