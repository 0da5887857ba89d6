package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/spf13/cobra"

	"github.com/kilnproject/kiln/builder/output"
	"github.com/kilnproject/kiln/initd/config"
	"github.com/kilnproject/kiln/internal/exitcode"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

func newISOCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "iso",
		Short: "Work on an iso output",
	}
	var out string
	add := &cobra.Command{
		Use:   "add-config ISO CONFIG -o NEW.iso",
		Short: "Copy an iso output with a node config on it, read by first boot from the medium",
		Long: `Add-config writes NEW.iso, a copy of the iso output ISO holding CONFIG (Ignition v3 JSON, or
Butane YAML translated to it) at ` + nodeimage.ISOConfigPath + `, replacing a config added before. First boot
on platform metal reads it from the medium (config source iso-medium, after kiln.config.url= and a
CIDATA volume): a live boot from the ISO, and a disk installed from an installer ISO that is still
in the drive at its first boot. CONFIG is parsed and validated as first boot parses it first; the
copy keeps the ISO's boot setup (xorriso replays its El Torito EFI entry and hybrid GPT) and every
other file's bytes, so the sha256s on its boot entries still hold. ISO is left as it is. xorriso
writes it.

` + exitHelp,
		Example: `  kiln iso add-config out/metal-worker.iso node-7.bu -o node-7.iso
  kiln iso add-config out/metal-worker.iso worker.ign -o worker.iso && dd if=worker.iso of=/dev/sdX bs=4M`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if out == "" {
				return exitcode.Usage(fmt.Errorf("-o: name the new iso to write"))
			}
			return isoAddConfig(cmd.Context(), cmd.OutOrStdout(), args[0], args[1], out)
		},
	}
	add.Flags().StringVarP(&out, "output", "o", "", "the new iso (must not exist)")
	cmd.AddCommand(add)
	return cmd
}

// isoAddConfig checks the config at cfgPath as first boot will parse it and writes dst, a copy
// of the iso src holding it (as Ignition JSON).
func isoAddConfig(ctx context.Context, w io.Writer, src, cfgPath, dst string) error {
	raw, err := os.ReadFile(cfgPath)
	if err != nil {
		return err
	}
	if _, err := config.Parse(raw); err != nil {
		return fmt.Errorf("%s: %w", cfgPath, err)
	}
	ign := raw
	if isButaneText(raw) {
		if ign, err = config.TranslateButane(raw); err != nil {
			return fmt.Errorf("%s: %w", cfgPath, err)
		}
	}
	if err := output.AddISOConfig(ctx, src, dst, ign); err != nil {
		return err
	}
	slog.Info("iso written", "iso", dst, "config", cfgPath, "path", nodeimage.ISOConfigPath)
	fmt.Fprintf(w, "%s: %s with %s at %s\n", dst, src, cfgPath, nodeimage.ISOConfigPath)
	return nil
}

// isButaneText reports whether a node config file is Butane YAML to translate: not empty, not
// Ignition JSON (first non-blank byte "{") and not gzip'd (passed as is; first boot unpacks it).
func isButaneText(raw []byte) bool {
	trimmed := bytes.TrimSpace(raw)
	return len(trimmed) > 0 && trimmed[0] != '{' && !bytes.HasPrefix(raw, []byte{0x1f, 0x8b})
}
