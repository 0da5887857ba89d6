package main

import (
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/kilnproject/kiln/initd/config"
)

func newKubeCmd(log *slog.Logger) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "kube images|cni|bootstrap|wait-api",
		Short: "The Kubernetes steps after first boot (kiln-images, kiln-cni, kiln-control-plane)",
		Long: `The Kubernetes steps after first boot, each run by its own unit. Each records a stage
(/var/lib/kiln/kube/<stage>.json) that kiln-init status shows, task by task. wait-api is
the controller-manager static pod's init container.`,
		Example: `  kiln-init kube images --for-kubelet
  kiln-init kube cni
  kiln-init kube bootstrap
  kiln-init kube wait-api --kubeconfig /etc/kubernetes/controller-manager.conf`,
		Args: cobra.ArbitraryArgs,
		RunE: needVerb,
	}
	cmd.AddCommand(newKubeImagesCmd(log), newKubeCNICmd(log), newKubeBootstrapCmd(log), newKubeWaitAPICmd(log))
	return cmd
}

// nodeName is the name kubelet registers the node as: the hostname first boot wrote to
// /etc/hostname, else node.yaml's, else the kernel's.
func nodeName(root string) (string, error) {
	if b, err := os.ReadFile(filepath.Join(root, "etc/hostname")); err == nil {
		if s := strings.TrimSpace(string(b)); s != "" {
			return s, nil
		}
	}
	n, err := config.LoadNodeIn(root)
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
