package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/kilnproject/kiln/builder/rootfs"
)

func newBaseCmd() *cobra.Command {
	base := &cobra.Command{
		Use:   "base",
		Short: "Manage base OS images",
		Args:  cobra.NoArgs,
		RunE:  showHelp,
	}
	var layoutDir, tag string
	imp := &cobra.Command{
		Use:   "import ROOTFS.tar",
		Short: "Turn a root filesystem tarball into a one-layer OCI image in an OCI layout",
		Long: `Import writes ROOTFS.tar as a single-layer linux/amd64 OCI image into the OCI image layout
--layout under the name --tag (replacing an older image of that name) and prints the manifest
digest. Image definitions reference it with base.layout + base.tag; ` + "`kiln lock`" + ` pins the digest.`,
		Example: `  images/base/build.sh /tmp/bookworm.tar
  kiln base import /tmp/bookworm.tar --layout ~/.cache/kiln/base --tag bookworm`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			d, err := rootfs.ImportTar(args[0], layoutDir, tag, time.Unix(0, 0).UTC())
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), d)
			return nil
		},
	}
	imp.Flags().StringVar(&layoutDir, "layout", "", "OCI image layout directory (created if missing)")
	imp.Flags().StringVar(&tag, "tag", "", "name of the image in the layout")
	_ = imp.MarkFlagRequired("layout")
	_ = imp.MarkFlagRequired("tag")
	base.AddCommand(imp)
	return base
}
