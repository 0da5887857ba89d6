package main

import (
	"github.com/spf13/cobra"
)

func newPublishCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "publish",
		Short: "Upload a baked image to a cloud and register it as a bootable image",
		Long: `Publish uploads a baked image to a cloud and registers it there: an AMI on AWS, an image on
GCE. Credentials come from each cloud SDK's standard chain. The file is hashed and checked
against the SHA-256 in its metadata (<image>.json beside it) before any request. Publishing is
idempotent: that digest is recorded on the cloud image, and publishing the same file again
under the same name returns the existing image without uploading, once kiln has checked that
image is one it made of that file (see each subcommand's help for what it checks).`,
		Args: cobra.NoArgs,
		RunE: showHelp,
	}
	cmd.AddCommand(newPublishAWSCmd(), newPublishGCECmd())
	return cmd
}
