package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/kilnproject/kiln/initd/dns"
	"github.com/kilnproject/kiln/initd/firstboot"
	"github.com/kilnproject/kiln/initd/kube"
	"github.com/kilnproject/kiln/initd/stage1"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

func newStatusCmd() *cobra.Command {
	var root, format string
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show what first boot did, task by task, the DNS state and the Kubernetes steps",
		Long: `Status prints the first-boot report (/var/lib/kiln/status.json): the outcome, the config's
source, each task and the files the config wrote; then how stage 1 booted the node
(/run/kiln/boot.json: disk or live, the root, where /var is); then the DNS registration and the
Kubernetes steps after first boot (images, cni, control-plane), each with its tasks.
With -o json it prints the first-boot report alone, as stored.`,
		Example: `  kiln-init status
  kiln-init status -o json | jq -r '.tasks[] | select(.state == "failed") | .error'`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(format); err != nil {
				return err
			}
			return printStatus(cmd, root, format)
		},
	}
	cmd.Flags().StringVar(&root, "root", "/", "root of the node's filesystem")
	outputFlag(cmd, &format)
	return cmd
}

func printStatus(cmd *cobra.Command, root, format string) error {
	w := cmd.OutOrStdout()
	st, err := firstboot.ReadStatus(root)
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("no status at %s: first boot has not run", filepath.Join(root, nodeimage.StatusPath))
	}
	if err != nil {
		return err
	}
	if err := firstboot.PrintStatus(w, st, format); err != nil || format == "json" {
		return err
	}
	if b, err := stage1.ReadBootInfo(root); err == nil {
		fmt.Fprintf(w, "\nBoot %s\n", b)
	}
	if d, err := (dns.StatusFile{Root: root}).Read(); err == nil {
		fmt.Fprintf(w, "\nDNS  %s (%s, %d records, attempts %d)\n", d.String(), d.Provider, len(d.Records), d.Attempts)
	}
	// The Kubernetes stages after first boot (images, cni, control-plane).
	stages, err := kube.ReadStages(root)
	if err != nil || len(stages) == 0 {
		return err
	}
	fmt.Fprintln(w)
	return kube.PrintStages(w, stages)
}
