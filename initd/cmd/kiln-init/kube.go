package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/kilnproject/kiln/initd/config"
	"github.com/kilnproject/kiln/initd/kube"
	"github.com/kilnproject/kiln/initd/task"
)

const kubeUsage = `kiln-init kube: the Kubernetes steps after first boot (each records a stage shown by kiln-init status)
  kiln-init kube images [--for-kubelet | --after-api]
                             import the pre-pulled images into containerd; --for-kubelet: only the
                             sandbox and static-pod images (kiln-images.service, before kubelet), the
                             rest after kubelet started (kiln-images-rest.service); --after-api: on a
                             control plane, once its API server answers ready
  kiln-init kube cni         write the CNI config once the node has a pod CIDR (kiln-cni.service, after kubelet)
  kiln-init kube bootstrap [--force]
                             kubeadm's init phases on a control plane: wait for the API, token, RBAC,
                             cluster-info, mark the node, addons (kiln-control-plane.service, after kubelet)
`

func runKube(ctx context.Context, args []string) error {
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, kubeUsage)
		return errors.New("kube: missing command")
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	switch args[0] {
	case "images":
		return runKubeImages(ctx, args[1:], log)
	case "cni":
		return runKubeCNI(ctx, args[1:], log)
	case "bootstrap":
		return runKubeBootstrap(ctx, args[1:], log)
	case "help", "-h", "--help":
		fmt.Print(kubeUsage)
		return nil
	}
	fmt.Fprint(os.Stderr, kubeUsage)
	return fmt.Errorf("kube: unknown command %q", args[0])
}

func runKubeImages(ctx context.Context, args []string, log *slog.Logger) error {
	fs := flag.NewFlagSet("kube images", flag.ContinueOnError)
	root := fs.String("root", "/", "root of the node's filesystem")
	layout := fs.String("layout", kube.ImagesPath, "OCI image layout with the pre-pulled images")
	ctr := fs.String("ctr", "ctr", "containerd's ctr")
	address := fs.String("address", "", "containerd's socket (default: ctr's)")
	forKubelet := fs.Bool("for-kubelet", false, "import only the images kubelet needs first: containerd's sandbox image and the static pods' images")
	afterAPI := fs.Bool("after-api", false, "on a control plane (admin.conf present), first wait for its API server to answer ready: "+
		"the images left for this step are used only once it serves, and unpacking them beside a starting API server starves it")
	apiWait := fs.Duration("api-wait", 20*time.Minute, "with --after-api: how long to wait for the API server (the import fails after it)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *forKubelet && *afterAPI {
		return errors.New("kube images: --for-kubelet and --after-api exclude each other (kubelet needs its images before the API server runs)")
	}
	stage := kube.StageImages
	if *forKubelet {
		stage = kube.StageImagesKubelet
	}
	var only []string // nil: every image of the layout
	var imported []string
	total := 0
	var tasks []task.Task
	var importAfter []string
	if *afterAPI {
		switch _, err := os.Stat(filepath.Join(*root, kube.AdminConf)); {
		case err == nil:
			tasks = append(tasks, kube.APIReadyTask(kube.BootstrapOptions{Root: *root, APIWait: *apiWait, Log: log}))
			importAfter = []string{"api-ready"}
		case !errors.Is(err, os.ErrNotExist):
			return fmt.Errorf("kube images: %w", err)
		}
	}
	tasks = append(tasks, task.Converge("import", importAfter, func(ctx context.Context) (bool, error) {
		all, err := kube.ReadLayout(*layout)
		if err != nil {
			return false, err
		}
		total = len(all)
		if *forKubelet {
			if only, err = kube.KubeletImages(*root, log); err != nil {
				return false, err
			}
			total = len(only)
		}
		imported, err = kube.ImportImages(ctx, kube.ImportOptions{Layout: *layout, Log: log,
			Ctr: kube.Ctr{Path: *ctr, Address: *address}, Only: only})
		return len(imported) > 0, err
	}))
	st, err := kube.RunStage(ctx, stage, tasks, kube.RunOptions{Root: *root, Log: log, TaskTimeout: 30 * time.Minute},
		func() string { return fmt.Sprintf("%d images, %d imported", total, len(imported)) })
	fmt.Println("kiln-init: " + st.Summary())
	return err
}

func runKubeCNI(ctx context.Context, args []string, log *slog.Logger) error {
	fs := flag.NewFlagSet("kube cni", flag.ContinueOnError)
	root := fs.String("root", "/", "root of the node's filesystem")
	node := fs.String("node", "", "the Node's name (default: this node's hostname)")
	wait := fs.Duration("wait", 15*time.Minute, "how long to wait for the node's pod CIDR")
	if err := fs.Parse(args); err != nil {
		return err
	}
	name := *node
	if name == "" {
		var err error
		if name, err = nodeName(*root); err != nil {
			return err
		}
	}
	var cidrs []string
	tasks := []task.Task{task.Converge("resolv-conf", nil, func(context.Context) (bool, error) {
		return kube.EnsureResolvConf(*root)
	}), kube.ConvergeWithTimeout("cni-config", []string{"resolv-conf"}, *wait+time.Minute, func(ctx context.Context) (bool, error) {
		var changed bool
		var err error
		cidrs, changed, err = kube.EnsureCNI(ctx, kube.CNIOptions{Root: *root, NodeName: name, Wait: *wait, Log: log})
		return changed, err
	})}
	st, err := kube.RunStage(ctx, kube.StageCNI, tasks, kube.RunOptions{Root: *root, Log: log}, func() string {
		if len(cidrs) == 0 {
			return "kept " + kube.CNIConfPath
		}
		return "podCIDR " + strings.Join(cidrs, ",") + " in " + kube.CNIConfPath
	})
	fmt.Println("kiln-init: " + st.Summary())
	return err
}

func runKubeBootstrap(ctx context.Context, args []string, log *slog.Logger) error {
	fs := flag.NewFlagSet("kube bootstrap", flag.ContinueOnError)
	root := fs.String("root", "/", "root of the node's filesystem")
	force := fs.Bool("force", false, "run every step again even if the bootstrap succeeded (changes nothing on a bootstrapped cluster)")
	apiWait := fs.Duration("api-wait", 20*time.Minute, "how long to wait for the API server")
	nodeWait := fs.Duration("node-wait", 10*time.Minute, "how long to wait for kubelet to register the node")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if prev, err := kube.ReadStage(*root, kube.StageControlPlane); err == nil && prev.State == kube.StateOK && !*force {
		fmt.Printf("kiln-init: control plane bootstrapped already (%s)\n", prev.Finished.Format(time.RFC3339))
		return nil
	}
	n, err := config.LoadNode(filepath.Join(*root, config.NodePath))
	if err != nil {
		return err
	}
	if n.Role != config.RoleControlPlane {
		return fmt.Errorf("kube bootstrap: %s says role %s; only a control plane bootstraps the cluster", config.NodePath, n.Role)
	}
	name, err := nodeName(*root)
	if err != nil {
		return err
	}
	tasks, err := kube.BootstrapTasks(kube.BootstrapOptions{Root: *root, NodeName: name, APIEndpoint: n.APIEndpoint,
		APIWait: *apiWait, NodeWait: *nodeWait, Log: log})
	if err != nil {
		return err
	}
	fmt.Printf("kiln-init: control plane bootstrap: waiting for the API server (up to %s)\n", *apiWait)
	st, err := kube.RunStage(ctx, kube.StageControlPlane, tasks, kube.RunOptions{Root: *root, Log: log},
		func() string { return "node " + name })
	if err != nil {
		step := st.FailedTask()
		if step == "" {
			step = "?"
		}
		fmt.Printf("kiln-init: control plane bootstrap failed at step %s: %s\n", step, st.Failure())
		return err
	}
	ready := st.Duration().Round(time.Second).String()
	if up, ok := uptime(); ok {
		ready = fmt.Sprintf("%d s", int(up.Seconds()))
	}
	fmt.Printf("kiln-init: control plane ready after %s (boot to ready; bootstrap %s, %s)\n",
		ready, st.Duration().Round(time.Second), (&task.Report{Tasks: st.Tasks}).Summary())
	return nil
}

// nodeName is the name kubelet registers the node as: the hostname first boot wrote to
// /etc/hostname, else node.yaml's, else the kernel's.
func nodeName(root string) (string, error) {
	if b, err := os.ReadFile(filepath.Join(root, "etc/hostname")); err == nil {
		if s := strings.TrimSpace(string(b)); s != "" {
			return s, nil
		}
	}
	n, err := config.LoadNode(filepath.Join(root, config.NodePath))
	switch {
	case err == nil && n.Hostname != "":
		return n.Hostname, nil
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		return "", err
	}
	return os.Hostname()
}

// uptime is the time since the kernel booted.
func uptime() (time.Duration, bool) {
	b, err := os.ReadFile("/proc/uptime")
	if err != nil {
		return 0, false
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0, false
	}
	s, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return 0, false
	}
	return time.Duration(s * float64(time.Second)), true
}
