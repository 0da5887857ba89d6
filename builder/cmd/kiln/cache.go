package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/kilnproject/kiln/builder/bake"
	"github.com/kilnproject/kiln/builder/rootfs"
	"github.com/kilnproject/kiln/builder/spec"
)

const cachePruneLong = `Prune removes from kiln's cache ($KILN_CACHE, else $XDG_CACHE_HOME/kiln, else
~/.cache/kiln) what no bake has used for --unused-for: downloaded artifacts and image blobs
(blobs/), flattened bases (base-trees/), pre-pulled images' and artifacts' applied trees (trees/,
artifact-trees/) and compressed initramfs archives (initramfs/). Every use marks an entry, so
a bake of the last --unused-for finds what it took still there; anything removed is fetched or
made again, and verified, when a bake needs it.

It also removes the blobs of the base OCI layout $KILN_CACHE/base (and of each --layout) that no
image there uses: kiln base import replacing a base of the same tag leaves the old one's blobs.
A lock file pinning such an old base no longer bakes; kiln lock pins the current one.

No bake runs while it prunes: bakes hold the cache shared and prune holds it alone (a lock
on $KILN_CACHE/.kiln-lock). When a bake is running, prune fails, or with --wait waits until no
bake runs; a bake that starts during a prune waits for it. It prints what it removes, kind by
kind, with the space freed (a file still linked from elsewhere frees nothing); --dry-run only
prints, and runs beside bakes.`

const cachePruneExample = `  kiln cache prune --dry-run
  kiln cache prune --unused-for 72h
  kiln cache prune --wait --unused-for 24h      # from cron, on a machine whose bakes overlap
  KILN_CACHE=/var/cache/kiln kiln cache prune --unused-for 24h -o json`

func newCacheCmd() *cobra.Command {
	cache := &cobra.Command{
		Use:   "cache",
		Short: "Manage kiln's build cache",
		Args:  cobra.NoArgs,
		RunE:  showHelp,
	}
	var (
		unusedFor time.Duration
		dryRun    bool
		wait      bool
		layouts   []string
		format    string
	)
	prune := &cobra.Command{
		Use:     "prune",
		Short:   "Remove cache entries no bake has used lately",
		Long:    cachePruneLong,
		Example: cachePruneExample,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if unusedFor <= 0 {
				return fmt.Errorf("--unused-for %v: want a duration above zero (e.g. 168h)", unusedFor)
			}
			if format != "table" && format != "json" {
				return fmt.Errorf("--output %q: want table or json", format)
			}
			root, err := spec.CacheDir()
			if err != nil {
				return err
			}
			if !cmd.Flags().Changed("layout") {
				if base := filepath.Join(root, "base"); rootfs.IsLayout(base) {
					layouts = []string{base}
				}
			}
			for _, l := range layouts {
				if !rootfs.IsLayout(l) {
					return fmt.Errorf("--layout %s: not an OCI image layout (no index.json)", l)
				}
			}
			pruned, err := bake.PruneCache(bake.PruneOptions{Root: root, Layouts: layouts,
				Before: time.Now().Add(-unusedFor), DryRun: dryRun, Wait: wait,
				Waiting: func() { slog.Info("waiting for the running bakes to finish", "cache", root) }})
			if errors.Is(err, bake.ErrCacheBusy) {
				return fmt.Errorf("%w: prune when no bake runs, or pass --wait", err)
			}
			if perr := printPruned(cmd.OutOrStdout(), format, root, pruned, dryRun); err == nil {
				err = perr
			}
			return err
		},
	}
	f := prune.Flags()
	f.DurationVar(&unusedFor, "unused-for", 7*24*time.Hour, "remove what no bake has used for this long")
	f.BoolVar(&dryRun, "dry-run", false, "print what would be removed; remove nothing")
	f.BoolVar(&wait, "wait", false, "when a bake is running, wait until none runs instead of failing")
	f.StringArrayVar(&layouts, "layout", nil, "a base OCI layout to remove unused blobs from (repeatable; default $KILN_CACHE/base)")
	f.StringVarP(&format, "output", "o", "table", "output format: table or json")
	cache.AddCommand(prune)
	return cache
}

// printPruned prints what was pruned (or, dry, would be) of the cache at root.
func printPruned(w io.Writer, format, root string, pruned []bake.Pruned, dryRun bool) error {
	if format == "json" {
		if pruned == nil {
			pruned = []bake.Pruned{}
		}
		out := struct {
			Cache  string        `json:"cache"`
			DryRun bool          `json:"dryRun"`
			Pruned []bake.Pruned `json:"pruned"`
		}{root, dryRun, pruned}
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	verb := "removed"
	if dryRun {
		verb = "would remove"
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "KIND\tENTRIES\tFREED\n")
	var n int
	var bytes int64
	for _, p := range pruned {
		fmt.Fprintf(tw, "%s\t%d\t%s\n", p.Kind, len(p.Entries), byteSize(p.Bytes))
		n += len(p.Entries)
		bytes += p.Bytes
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	noun := "entries"
	if n == 1 {
		noun = "entry"
	}
	_, err := fmt.Fprintf(w, "%s %d %s, %s, from %s\n", verb, n, noun, byteSize(bytes), root)
	return err
}

// byteSize is n bytes in MiB, or in GiB from 1 GiB.
func byteSize(n int64) string {
	if n >= 1<<30 {
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	}
	return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
}
