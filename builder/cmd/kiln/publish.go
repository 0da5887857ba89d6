package main

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/spf13/cobra"

	"github.com/kilnproject/kiln/builder/provenance"
	"github.com/kilnproject/kiln/builder/publish"
	"github.com/kilnproject/kiln/internal/exitcode"
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
image is one it made of that file (see each subcommand's help for what it checks).

With --key PUB (or $KILN_VERIFY_KEY), kiln first checks the bake's signed provenance
(<image>-<role>.intoto.jsonl, from kiln bake --sign-key) as kiln verify does: signed by PUB,
naming the metadata beside the file with its sha256 and the file with the digest the metadata
gives. An image that does not verify is refused before any request, naming what failed. The
provenance's SHA-256 is recorded on what the publish makes: the tag kiln:provenance-sha256
on AWS, the label kiln-provenance (63 hex digits) and "provenance sha256:<hex>" in the
description on GCE. An image found from an earlier publish keeps what it was published with
(a warning says so when that differs).`,
		Args: cobra.NoArgs,
		RunE: showHelp,
	}
	cmd.AddCommand(newPublishAWSCmd(), newPublishGCECmd())
	return cmd
}

// keyFlag adds --key to a publish verb: the public key its image's provenance must verify
// with, default $KILN_VERIFY_KEY.
func keyFlag(cmd *cobra.Command, key *string) {
	cmd.Flags().StringVar(key, "key", "", "PEM public key (ed25519 or ECDSA P-256): refuse the image unless its signed provenance verifies with it (default: $KILN_VERIFY_KEY)")
}

// verifyBeforePublish checks im's signed provenance with the public key at keyPath (or
// $KILN_VERIFY_KEY) when one is given; without either it does nothing.
func verifyBeforePublish(im *publish.Image, keyPath string) error {
	if keyPath == "" {
		keyPath = os.Getenv("KILN_VERIFY_KEY")
	}
	if keyPath == "" {
		return nil
	}
	pub, err := provenance.LoadPublicKey(keyPath)
	if err != nil {
		return exitcode.Usagef("--key: %v", err)
	}
	if err := im.VerifyProvenance(pub); err != nil {
		return fmt.Errorf("publish: refusing an image whose provenance does not verify: %w", err)
	}
	slog.Info("publish: provenance verified", "file", im.Path, "provenance", im.Provenance.File, "sha256", im.Provenance.SHA256)
	return nil
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
