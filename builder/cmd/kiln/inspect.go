package main

import (
	"encoding/json"
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/kilnproject/kiln/builder/disk"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

func newInspectCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "inspect IMAGE.raw",
		Short: "Show an image's partitions, boot entry, kernel and metadata",
		Long: `Inspect reads a raw image without booting or mounting it: the GPT partitions, the systemd-boot
entry and kernel command line on the ESP, and the image metadata (/kiln/image.json on the ESP,
the same as /etc/kiln/image.json in the root).`,
		Example: `  kiln inspect out/qemu-worker.raw
  kiln inspect out/qemu-worker.raw --json | jq .metadata.artifacts`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			res, esp, err := disk.Read(args[0])
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			if asJSON {
				var md any
				if len(esp.ImageJSON) > 0 {
					if err := json.Unmarshal(esp.ImageJSON, &md); err != nil {
						return fmt.Errorf("%s: %s: %w", args[0], nodeimage.ESPImageJSONPath, err)
					}
				}
				enc := json.NewEncoder(w)
				enc.SetIndent("", "  ")
				return enc.Encode(map[string]any{"disk": res, "esp": esp, "metadata": md})
			}
			fmt.Fprintf(w, "disk %s  GUID %s\n\n", args[0], res.DiskGUID)
			tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "#\tNAME\tSTART\tSIZE\tTYPE\tPARTUUID")
			for _, p := range res.Partitions {
				fmt.Fprintf(tw, "%d\t%s\t%d MiB\t%d MiB\t%s\t%s\n", p.Number, p.Name, p.Start>>20, p.Size>>20, p.Type, p.GUID)
			}
			tw.Flush()
			fmt.Fprintf(w, "\ncmdline: %s\n", res.Cmdline)
			var md struct {
				Name, Role, Platform string
				Kernel               struct{ Version string }
				Base                 struct{ Ref, Digest string }
				Kubernetes           *struct {
					Version, Runtime, Containerd string
					Images                       []struct{ Name, Digest string }
				}
			}
			if esp != nil && json.Unmarshal(esp.ImageJSON, &md) == nil {
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
			if esp != nil {
				fmt.Fprintf(w, "\nESP files:\n")
				for _, f := range esp.Files {
					fmt.Fprintf(w, "  %-28s %9d bytes\n", f.Path, f.Size)
				}
				if len(esp.ImageJSON) > 0 {
					fmt.Fprintf(w, "\nimage.json:\n%s", esp.ImageJSON)
				}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print everything as one JSON document")
	return cmd
}
