package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/kilnproject/kiln/initd/kube"
	"github.com/kilnproject/kiln/initd/task"
	"github.com/kilnproject/kiln/internal/exitcode"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

// imagesFlags are kube images' flags.
type imagesFlags struct {
	root, layout, ctr, address string
	namespace                  string
	forKubelet, afterAPI       bool
	apiWait                    time.Duration
}

func newKubeImagesCmd(log *slog.Logger) *cobra.Command {
	var o imagesFlags
	cmd := &cobra.Command{
		Use:   "images [--for-kubelet | --after-api]",
		Short: "Import the pre-pulled images into containerd",
		Long: `Images imports the image's pre-pulled images into containerd. With --for-kubelet, only the
sandbox and static-pod images (kiln-images.service, before kubelet); without, the rest after
kubelet started (kiln-images-rest.service); --after-api: on a control plane, once its API
server answers ready.

Images the bake laid in containerd's store (image.json: "unpacked": true; first boot copies the
store into /var/lib/containerd before containerd starts) are present already with their digest:
nothing is imported for them. The others (and any image containerd lacks, or holds with another
digest) are imported from the layout. It fails when containerd's store has image snapshots laid
at bake that this root filesystem lacks (a store seeded from another image).`,
		Example: `  kiln-init kube images --for-kubelet
  kiln-init kube images --after-api --api-wait 30m`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.forKubelet && o.afterAPI {
				return exitcode.Usagef("kube images: --for-kubelet and --after-api exclude each other (kubelet needs its images before the API server runs)")
			}
			return importImages(cmd, o, log)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.root, "root", "/", "root of the node's filesystem")
	f.StringVar(&o.layout, "layout", nodeimage.ImagesPath, "OCI image layout with the pre-pulled images")
	f.StringVar(&o.ctr, "ctr", "ctr", "containerd's ctr")
	f.StringVar(&o.address, "address", "", "containerd's socket (default: ctr's)")
	f.StringVar(&o.namespace, "namespace", "", "containerd namespace to import into (default: the image's runtime's, from image.json: k8s.io for containerd, moby for docker)")
	f.BoolVar(&o.forKubelet, "for-kubelet", false, "import only the images kubelet needs first: containerd's sandbox image and the static pods' images")
	f.BoolVar(&o.afterAPI, "after-api", false, "on a control plane (admin.conf present), first wait for its API server to answer ready: "+
		"the images left for this step are used only once it serves, and unpacking them beside a starting API server starves it")
	f.DurationVar(&o.apiWait, "api-wait", 20*time.Minute, "with --after-api: how long to wait for the API server (the import fails after it)")
	return cmd
}

// importImages runs the images stage: the wait for the API server when asked and due, then
// the import.
func importImages(cmd *cobra.Command, o imagesFlags, log *slog.Logger) error {
	stage := kube.StageImages
	if o.forKubelet {
		stage = kube.StageImagesKubelet
	}
	var tasks []task.Task
	var importAfter []string
	if o.afterAPI {
		switch _, err := os.Stat(filepath.Join(o.root, nodeimage.AdminConfPath)); {
		case err == nil:
			tasks = append(tasks, kube.APIReadyTask(kube.BootstrapOptions{Root: o.root, APIWait: o.apiWait, Log: log}))
			importAfter = []string{"api-ready"}
		case !errors.Is(err, os.ErrNotExist):
			return fmt.Errorf("kube images: %w", err)
		}
	}
	var total, imported int
	tasks = append(tasks, task.Converge("import", importAfter, func(ctx context.Context) (bool, error) {
		var err error
		total, imported, err = o.importImages(ctx, log)
		return imported > 0, err
	}))
	st, err := kube.RunStage(cmd.Context(), stage, tasks, kube.RunOptions{Root: o.root, Log: log, TaskTimeout: 30 * time.Minute},
		func() string { return fmt.Sprintf("%d images, %d imported", total, imported) })
	fmt.Fprintln(cmd.OutOrStdout(), "kiln-init: "+st.Summary())
	return err
}

// importImages imports the layout's images (only kubelet's with --for-kubelet) and returns
// how many it considered and how many it imported.
func (o imagesFlags) importImages(ctx context.Context, log *slog.Logger) (total, imported int, err error) {
	if err := kube.CheckStore(o.root); err != nil {
		return 0, 0, err
	}
	ns := o.namespace
	if ns == "" {
		img, err := nodeimage.ReadImage(o.root)
		if err != nil {
			return 0, 0, err
		}
		rt, err := img.Runtime()
		if err != nil {
			return 0, 0, err
		}
		ns = rt.Namespace
	}
	all, err := kube.ReadLayout(o.layout)
	if err != nil {
		return 0, 0, err
	}
	total = len(all)
	var only []string // nil: every image of the layout
	if o.forKubelet {
		if only, err = kube.KubeletImages(o.root, log); err != nil {
			return total, 0, err
		}
		total = len(only)
	}
	done, err := kube.ImportImages(ctx, kube.ImportOptions{Layout: o.layout, Log: log,
		Ctr: kube.Ctr{Path: o.ctr, Address: o.address, Namespace: ns}, Only: only})
	return total, len(done), err
}
