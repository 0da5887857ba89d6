package main

import (
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/kilnproject/kiln/builder/disk"
	"github.com/kilnproject/kiln/internal/exitcode"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

func newInspectCmd() *cobra.Command {
	var format string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "inspect IMAGE.raw",
		Short: "Show an image's partitions, boot entry, kernel and metadata",
		Long: `Inspect reads a raw image without booting or mounting it: the GPT partitions, the systemd-boot
entry and kernel command line on the ESP, and the image metadata (/kiln/image.json on the ESP,
the same as /etc/kiln/image.json in the root). -o json prints all of it as one JSON document
(--json is the same).`,
		Example: `  kiln inspect out/qemu-worker.raw
  kiln inspect out/qemu-worker.raw -o json | jq .metadata.artifacts`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if asJSON {
				format = "json"
			}
			if format != "table" && format != "json" {
				return exitcode.Usagef("-o: unknown output format %q (want table or json)", format)
			}
			res, esp, err := disk.Read(args[0])
			if err != nil {
				return err
			}
			var md *nodeimage.Metadata
			if esp != nil && len(esp.ImageJSON) > 0 {
				md = new(nodeimage.Metadata)
				if err := json.Unmarshal(esp.ImageJSON, md); err != nil {
					return fmt.Errorf("%s: %s: %w", args[0], nodeimage.ESPImageJSONPath, err)
				}
			}
			w := cmd.OutOrStdout()
			if format == "json" {
				enc := json.NewEncoder(w)
				enc.SetIndent("", "  ")
				return enc.Encode(map[string]any{"disk": res, "esp": esp, "metadata": md})
			}
			printInspect(w, args[0], res, esp, md)
			return nil
		},
	}
	cmd.Flags().StringVarP(&format, "output", "o", "table", "output format: table or json")
	cmd.Flags().BoolVar(&asJSON, "json", false, "the same as -o json")
	return cmd
}

// printInspect writes what inspect found for people to read.
func printInspect(w io.Writer, image string, res *disk.Result, esp *disk.ESPInfo, md *nodeimage.Metadata) {
	fmt.Fprintf(w, "disk %s  GUID %s\n\n", image, res.DiskGUID)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "#\tNAME\tSTART\tSIZE\tTYPE\tPARTUUID")
	for _, p := range res.Partitions {
		fmt.Fprintf(tw, "%d\t%s\t%d MiB\t%d MiB\t%s\t%s\n", p.Number, p.Name, p.Start>>20, p.Size>>20, p.Type, p.GUID)
	}
	tw.Flush()
	fmt.Fprintf(w, "\ncmdline: %s\n", res.Cmdline)
	if md != nil {
		fmt.Fprintf(w, "image:   %s, role %s, platform %s\n", md.Name, md.Role, md.Platform)
		fmt.Fprintf(w, "kernel:  %s\n", md.Kernel.Version)
		fmt.Fprintf(w, "base:    %s@%s\n", md.Base.Ref, md.Base.Digest)
		if k := md.Kubernetes; k != nil {
			fmt.Fprintf(w, "kubernetes: %s, runtime %s", k.Version, k.Runtime)
			if k.Containerd != "" {
				fmt.Fprintf(w, " (containerd %s)", k.Containerd)
			}
			fmt.Fprintf(w, ", %d pre-pulled images\n", len(k.Images))
			for _, im := range k.Images {
				fmt.Fprintf(w, "  %s@%s\n", im.Name, im.Digest)
			}
		}
	}
	if esp == nil {
		return
	}
	fmt.Fprintf(w, "\nESP files:\n")
	for _, f := range esp.Files {
		fmt.Fprintf(w, "  %-28s %9d bytes\n", f.Path, f.Size)
	}
	if len(esp.ImageJSON) > 0 {
		fmt.Fprintf(w, "\nimage.json:\n%s", esp.ImageJSON)
	}
}
