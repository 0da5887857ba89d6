package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/kilnproject/kiln/builder/qemucluster"
)

// clusterUpdateLong is `kiln cluster update --help`.
const clusterUpdateLong = `Update moves running nodes to newly baked images in place, one node at a time, as a fleet's
rolling update does: each node writes the new image to its other root slot and boots it on
trial (kiln-init update; see docs/updates.md), keeping /var, /etc's changes, its etcd disk
and its identity.

Nodes go in this order: the etcd nodes, the control planes, the workers (only those named,
when NODE is given). For each node, kiln:

  1. serves <image>-<role>.json and its pxe directory from --image-dir on the host's
     loopback and forwards them to the node's over an ssh session (the nodes' user network
     reaches nothing on the host), in which kiln-init update checks and writes the other
     slot;
  2. powers the node off and boots it again (a cold boot, as kiln cluster start);
  3. waits until the node is Ready (an etcd node: its member votes), kiln-init found the
     new slot good and blessed it, and a node with an etcd member has the same member
     (same ID) voting again.

A node that rolls back to its old slot (the new one failed its tries) stops the update with
the reason the node recorded; the nodes after it are not touched. The cluster must have been
made with kiln cluster up --ssh-key; --identity names the private key when ssh would not find
it by itself. The new images must be baked with the pxe format (images/qemu.yaml lists it)
into another directory than the one the cluster's disks are overlays on.`

// clusterUpdateExample is `kiln cluster update`'s examples.
const clusterUpdateExample = `  # bake the new images elsewhere, then roll every node (etcd nodes, control planes, workers)
  kiln bake images/qemu.yaml --role control-plane -o out-v2
  kiln bake images/qemu.yaml --role worker -o out-v2
  kiln cluster update --name demo --image-dir out-v2 --identity ~/.ssh/id_ed25519

  # one worker only
  kiln cluster update demo-worker-1 --name demo --image-dir out-v2`

func newClusterUpdateCmd() *cobra.Command {
	var (
		ref clusterRef
		o   qemucluster.UpdateOptions
	)
	cmd := &cobra.Command{
		Use:     "update [NODE...] --name NAME --image-dir DIR",
		Short:   "Move running nodes to new images in place, one at a time (A/B slots, rollback), waiting until each is Ready",
		Long:    clusterUpdateLong,
		Example: clusterUpdateExample,
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := ref.load()
			if err != nil {
				return err
			}
			order, err := s.UpdateOrder(args)
			if err != nil {
				return err
			}
			start := time.Now()
			if err := s.Update(cmd.Context(), args, o, newProgressPrinter(cmd.OutOrStdout(), order).report); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "updated %d node(s) of cluster %s to the images in %s in %s\n", len(order), s.Name, o.ImageDir, time.Since(start).Round(time.Second))
			return nil
		},
	}
	ref.flags(cmd)
	f := cmd.Flags()
	f.StringVar(&o.ImageDir, "image-dir", "", "directory of the new images (<image>-<role>.json and its pxe directory)")
	f.StringVar(&o.Image, "image", "qemu", "image name: the files are <image>-<role>.json")
	f.StringVarP(&o.Identity, "identity", "i", "", "ssh private key that logs in as root on the nodes (default: ssh's own choice)")
	f.BoolVar(&o.AllowDowngrade, "allow-downgrade", false, "accept images created before the ones the nodes run")
	f.DurationVar(&o.Timeout, "timeout", 30*time.Minute, "how long each node's update may take, from the write to its blessing")
	cmd.MarkFlagRequired("image-dir")
	return cmd
}
