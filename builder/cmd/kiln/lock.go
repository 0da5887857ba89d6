package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/spf13/cobra"

	"github.com/kilnproject/kiln/builder/artifact"
	"github.com/kilnproject/kiln/builder/spec"
)

func newLockCmd() *cobra.Command {
	var update bool
	var overlays []string
	cmd := &cobra.Command{
		Use:   "lock DEFINITION",
		Short: "Pin the base image, every artifact and every container image of a definition in its lock file",
		Long: `Lock resolves what a definition names by tag (the base image, the profiles' container
images) to a digest — for a multi-platform image, that of its linux/amd64 manifest — and
downloads once any artifact given without a sha256 to record its hash, checked against the
publisher's checksum: the profile's checksum URL, else <url>.sha256 or <url>.sha256sum beside the
file (dl.k8s.io, containerd, crictl, the CNI plugins put one there). A download the checksum
contradicts is refused; the lock records which checksum file confirmed each pin ("pinnedFrom"),
or "download" when there was none to check. It writes <name>.lock next
to the definition, covering every role profile. Entries that still match are kept; --update re-resolves
them all. ` + "`kiln bake`" + ` refuses anything the definition and its lock leave unpinned.
Registry credentials come from the docker config and credential helpers, as for kiln bake.`,
		Example: `  kiln lock images/qemu.yaml
  kiln lock --update images/qemu.yaml   # after rebuilding the base image
  kiln lock images/qemu.yaml --profile-overlay local.yaml   # what kiln bake --profile-overlay local.yaml will use`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			def, err := spec.LoadDefinition(args[0])
			if err != nil {
				return err
			}
			profiles, err := def.Profiles()
			if err != nil {
				return err
			}
			for _, f := range overlays {
				ov, err := spec.LoadProfileOverlay(f)
				if err != nil {
					return err
				}
				if err := ov.Check(profiles); err != nil {
					return err
				}
				for i, p := range profiles {
					profiles[i] = ov.Apply(p)
				}
			}
			cache, err := artifact.DefaultCache()
			if err != nil {
				return err
			}
			path := artifact.LockPath(def)
			old, err := artifact.ReadLock(path)
			if err != nil && !errors.Is(err, os.ErrNotExist) {
				return err
			}
			pn := &artifact.Pinner{Cache: cache, Resolver: artifact.OCIResolver{Remote: artifact.RemoteOptions(authn.DefaultKeychain)}, Update: update}
			l, notes, err := pn.Pin(cmd.Context(), def, profiles, old)
			if err != nil {
				return err
			}
			if err := l.Write(path); err != nil {
				return err
			}
			for _, n := range notes {
				fmt.Fprintln(cmd.OutOrStdout(), n)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %s\n", path)
			return nil
		},
	}
	cmd.Flags().BoolVar(&update, "update", false, "re-resolve every entry, even those already pinned")
	cmd.Flags().StringArrayVar(&overlays, "profile-overlay", nil, "profile overlay applied to every profile before pinning, as kiln bake applies it (repeatable)")
	return cmd
}
