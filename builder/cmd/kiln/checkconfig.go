package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kilnproject/kiln/builder/output"
	"github.com/kilnproject/kiln/initd/config"
	"github.com/kilnproject/kiln/internal/exitcode"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

const checkConfigLong = `Check-config checks node configs (Ignition v3 JSON or Butane YAML) the way a node's first boot
will take them, and against the image they are for: every field kiln applies and nothing else,
then what the image holds, as its bake recorded it in <image>-<role>.json ("contents"):

  - files, directories and links only where a node writes (/etc, /var, and /usr/local, /opt,
    /home, /root as the image makes them writable; the rest is the read-only root);
  - users' groups, primary groups and file owners that the image or the config has;
  - units enabled or given drop-ins that the image ships or the config writes;
  - programs: a unit's Exec lines may not run a program the read-only root lacks (/bin/podman
    on an image without podman), and files for a program the image lacks (NetworkManager
    keyfiles, podman quadlet files, /etc/docker, /etc/crio, /etc/zincati) are refused.

Several configs are checked one by one and merged in order, as kiln run --config merges them.
The configs they reference (ignition.config.merge and replace) are then followed as first
boot follows them: data: URLs (Butane's inline and local) are decoded, http, https and tftp
sources fetched (one try, 30 s), each checked against its verification.hash and size cap,
parsed, validated and merged by Ignition's rules (replace takes the place of the config,
merges go over it in order, the merged config's entries winning), references inside them
followed too (10 deep at most, no loops); the result is what is checked against the image.
A source that cannot be fetched from here (no route, a refused connection, an HTTP 404 or
403) is not an error: it is named with the reason on stderr, and the ok line says which
references were not checked. --offline fetches none. A fetched config that is not what its
hash says, is over the cap, or is refused is an error naming the reference's JSON path and
source, e.g. "ignition.config.merge[0] (https://h/node.ign): storage.files[0].mode: ...".

Every finding names the config and the JSON path; check-config exits 1 when there is any, so
it fits in CI before configs are published. IMAGE is the bake's <image>-<role>.json or any of
its outputs (the .json beside it is read).

` + exitHelp

const checkConfigExample = `  kiln check-config node.bu --image out/qemu-worker.json
  kiln check-config base.ign site.bu --image out/aws-worker.raw
  kiln check-config node.bu --files-dir files/ --image out/qemu-control-plane.qcow2

  # a pointer config merging one published at https://configs.example.com/worker.ign
  kiln check-config pointer.bu --image out/aws-worker.raw
  kiln check-config pointer.bu --image out/aws-worker.raw --offline   # CI without network`

func newCheckConfigCmd() *cobra.Command {
	var image, filesDir string
	var offline bool
	cmd := &cobra.Command{
		Use:     "check-config CONFIG... --image IMAGE",
		Short:   "Check node configs against an image before any node boots",
		Long:    checkConfigLong,
		Example: checkConfigExample,
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if image == "" {
				return exitcode.Usage(fmt.Errorf("--image: name the image the configs are for"))
			}
			return checkConfig(cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr(), args, image, filesDir, offline)
		},
	}
	cmd.Flags().StringVar(&image, "image", "", "the image: its <image>-<role>.json or an output beside it (required)")
	cmd.Flags().StringVar(&filesDir, "files-dir", "", "directory Butane's local keys are relative to, as butane -d")
	cmd.Flags().BoolVar(&offline, "offline", false, "fetch no http, https or tftp config the configs reference; name each as not checked")
	return cmd
}

// errOffline is why a remote reference is not checked under --offline.
var errOffline = errors.New("not fetched (--offline)")

// checkConfig checks the configs at paths, merged and with their references followed (remote
// ones only when reachable, none when offline), against image; it prints the outcome on w and
// each reference it could not check on warn.
func checkConfig(ctx context.Context, w, warn io.Writer, paths []string, image, filesDir string, offline bool) error {
	md, mdFile, err := imageMetadata(image)
	if err != nil {
		return err
	}
	if md.Contents == nil {
		return fmt.Errorf("%s: no contents recorded: the image was baked by a kiln that did not record them; bake it again", mdFile)
	}
	merged, err := loadConfigs(paths, filesDir)
	if err != nil {
		return err
	}
	name := strings.Join(paths, " + ")
	get := config.URLGetter(config.FetchOptions{})
	if offline {
		get = func(context.Context, string) ([]byte, error) { return nil, errOffline }
	}
	var unchecked []string
	merged, err = merged.Render(ctx, config.RenderOptions{Get: get, Unreachable: func(field, source string, err error) {
		unchecked = append(unchecked, fmt.Sprintf("%s (%s)", field, source))
		fmt.Fprintf(warn, "%s: %s (%s) not checked: %v\n", name, field, source, err)
	}})
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	if err := errors.Join(merged.CheckImage(md.Contents), merged.CheckRole(config.Role(md.Role))); err != nil {
		return fmt.Errorf("%s against %s:\n%w", name, mdFile, err)
	}
	fmt.Fprintf(w, "%s: ok for %s (%s, role %s)", name, filepath.Base(mdFile), md.Name, md.Role)
	if len(merged.Referenced) > 0 {
		fmt.Fprintf(w, " with %s", strings.Join(merged.Referenced, ", "))
	}
	if len(unchecked) > 0 {
		fmt.Fprintf(w, "; not checked: %s", strings.Join(unchecked, ", "))
	}
	fmt.Fprintln(w)
	return nil
}

// imageMetadata reads the bake's metadata of image: the <image>-<role>.json itself, the one
// beside a pxe directory, or the one beside any other output (same stem).
func imageMetadata(image string) (*nodeimage.Metadata, string, error) {
	file, err := metadataFileOf(image)
	if err != nil {
		f := output.OfFile(image)
		if f == "" || f == "pxe" {
			return nil, "", fmt.Errorf("%s: not an image output (.raw, .qcow2, .vmdk, .vhd, .tar.gz, .iso, a pxe directory) nor its .json", image)
		}
		fm, _ := output.Lookup(f)
		file = strings.TrimSuffix(image, fm.Suffix) + ".json"
	}
	md, err := readMetadata(file)
	return md, file, err
}

// loadConfigs parses and validates each config as a node does and merges them in order
// (Ignition's rules: later entries win); errors name the file.
func loadConfigs(paths []string, filesDir string) (*config.Config, error) {
	opts := config.Options{FilesDir: filesDir}
	var merged *config.Config
	for _, path := range paths {
		raw, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		c, err := config.ParseWith(raw, opts)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if err := c.Validate(); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		merged = config.Merge(merged, c)
	}
	if len(paths) > 1 {
		if err := merged.Validate(); err != nil {
			return nil, fmt.Errorf("%s merged: %w", strings.Join(paths, " + "), err)
		}
	}
	return merged, nil
}
