package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
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
		Use:   "inspect IMAGE.raw | IMAGE-ROLE.json | IMAGE-ROLE-pxe/",
		Short: "Show an image's partitions, boot entry, kernel, metadata and PXE files",
		Long: `Inspect reads a raw image without booting or mounting it: the GPT partitions, the systemd-boot
entry and kernel command line on the ESP, and the image metadata (/kiln/image.json on the ESP,
the same as /etc/kiln/image.json in the root). It reads every block of root-a and checks it
against the dm-verity root hash of the boot entry (kiln.verity.roothash=), as the node does at
boot: a block changed since the bake is named and inspect exits 1.

Given the bake's <image>-<role>.json, it shows the metadata and every output file with its
sha256; given a pxe directory (<image>-<role>-pxe/, read with the .json beside it), the kernel
arguments of a network boot and its files. The files of a pxe directory are hashed and
compared with the sha256 and size the metadata records: a file that does not match is named
and inspect exits 1.

-o json prints all of it as one JSON document (--json is the same).`,
		Example: `  kiln inspect out/qemu-worker.raw
  kiln inspect out/qemu-worker.raw -o json | jq .metadata.artifacts
  kiln inspect out/metal-worker-pxe/
  kiln inspect out/metal-worker.json -o json | jq .pxe.files`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if asJSON {
				format = "json"
			}
			if format != "table" && format != "json" {
				return exitcode.Usagef("-o: unknown output format %q (want table or json)", format)
			}
			w := cmd.OutOrStdout()
			if isOutputsArg(args[0]) {
				return inspectOutputs(w, args[0], format == "json")
			}
			return inspectDisk(w, args[0], format == "json")
		},
	}
	cmd.Flags().StringVarP(&format, "output", "o", "table", "output format: table or json")
	cmd.Flags().BoolVar(&asJSON, "json", false, "the same as -o json")
	return cmd
}

// isOutputsArg says whether arg names a bake's metadata or a pxe directory rather than a disk.
func isOutputsArg(arg string) bool {
	if fi, err := os.Stat(arg); err == nil && fi.IsDir() {
		return true
	}
	return strings.HasSuffix(arg, ".json") || strings.HasSuffix(strings.TrimRight(arg, "/"), nodeimage.PXEDirSuffix)
}

// inspectDisk shows a raw image: its partitions, the ESP and the image metadata on it.
func inspectDisk(w io.Writer, image string, asJSON bool) error {
	res, esp, err := disk.Read(image)
	if err != nil {
		return err
	}
	var md *nodeimage.Metadata
	if esp != nil && len(esp.ImageJSON) > 0 {
		md = new(nodeimage.Metadata)
		if err := json.Unmarshal(esp.ImageJSON, md); err != nil {
			return fmt.Errorf("%s: %s: %w", image, nodeimage.ESPImageJSONPath, err)
		}
	}
	ver, checkErr := checkVerity(image, res)
	if asJSON {
		if err := writeJSON(w, map[string]any{"disk": res, "esp": esp, "metadata": md, "verity": ver}); err != nil {
			return err
		}
		return checkErr
	}
	printInspect(w, image, res, esp, md, ver)
	return checkErr
}

// writeJSON writes v as indented JSON.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// printInspect writes what inspect found for people to read.
func printInspect(w io.Writer, image string, res *disk.Result, esp *disk.ESPInfo, md *nodeimage.Metadata, ver *verityReport) {
	fmt.Fprintf(w, "disk %s  GUID %s\n\n", image, res.DiskGUID)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "#\tNAME\tSTART\tSIZE\tTYPE\tPARTUUID")
	for _, p := range res.Partitions {
		fmt.Fprintf(tw, "%d\t%s\t%d MiB\t%d MiB\t%s\t%s\n", p.Number, p.Name, p.Start>>20, p.Size>>20, p.Type, p.GUID)
	}
	tw.Flush()
	fmt.Fprintf(w, "\ncmdline: %s\n", res.Cmdline)
	printVerity(w, ver)
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
				switch {
				case im.Unpacked:
					fmt.Fprintf(w, "  %s@%s, ready in containerd's store\n", im.Name, im.Digest)
				case im.ImportReason != "":
					fmt.Fprintf(w, "  %s@%s, imported at first boot (%s)\n", im.Name, im.Digest, im.ImportReason)
				default:
					fmt.Fprintf(w, "  %s@%s\n", im.Name, im.Digest)
				}
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
