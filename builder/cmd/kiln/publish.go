package main

import (
	"encoding/json"
	"io"

	"github.com/spf13/cobra"

	"github.com/kilnproject/kiln/builder/publish"
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

// publishTo publishes im with p (the verb has built it from its flags) and prints the
// result: its JSON with -o json, else its text.
func publishTo(cmd *cobra.Command, p publish.Publisher, im *publish.Image, format string) error {
	res, err := p.Publish(cmd.Context(), im)
	if err != nil {
		return err
	}
	return printResult(cmd.OutOrStdout(), format, res)
}

// printResult writes res as JSON (format "json") or as its text.
func printResult(w io.Writer, format string, res publish.Result) error {
	if format == "json" {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(res)
	}
	return res.WriteText(w)
}
