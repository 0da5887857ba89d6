package main

import (
	"github.com/spf13/cobra"
)

func newPublishCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "publish",
		Short: "Upload a baked image to a cloud and register it as a bootable image",
		Long: `Publish uploads a baked image to a cloud and registers it there: an AMI on AWS, an image on
GCE. Credentials come from each cloud SDK's standard chain. Publishing is idempotent: the
image's SHA-256 from its metadata (<image>.json beside it) is recorded on the cloud image, and
publishing the same file again returns the existing image without uploading.`,
		Args: cobra.NoArgs,
		RunE: showHelp,
	}
	cmd.AddCommand(newPublishAWSCmd(), newPublishGCECmd())
	return cmd
}
