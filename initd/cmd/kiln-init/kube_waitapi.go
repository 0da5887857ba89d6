package main

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/spf13/cobra"

	"github.com/kilnproject/kiln/initd/kube"
)

func newKubeWaitAPICmd(log *slog.Logger) *cobra.Command {
	var kubeconfig string
	o := kube.WaitAPIOptions{Log: log}
	cmd := &cobra.Command{
		Use:   "wait-api --kubeconfig FILE [--path /healthz] [--timeout D]",
		Short: "Wait until the API server of a kubeconfig answers ok (the controller-manager's init container)",
		Long: `Wait-api asks the API server of the kubeconfig's current context for a health endpoint
until it answers "ok", logging the checks that still fail whenever they change.

The control plane's kube-controller-manager static pod runs it as its init container with
the controller-manager's own kubeconfig: kube-controller-manager exits when /healthz is not
ok within 10 s of winning its leader lease, which on a slow first boot happens while the
API server is still running its post-start hooks. It exits 0 once the endpoint is ok, 1
when --timeout passes first.`,
		Example: `  kiln-init kube wait-api --kubeconfig /etc/kubernetes/controller-manager.conf
  kiln-init kube wait-api --kubeconfig /etc/kubernetes/admin.conf --path /readyz --timeout 10m`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch o.Path {
			case "/healthz", "/readyz", "/livez":
			default:
				return fmt.Errorf("--path %q: one of /healthz, /readyz, /livez", o.Path)
			}
			c, err := kube.LoadKubeconfig("/", kubeconfig)
			if err != nil {
				return err
			}
			return kube.WaitAPI(cmd.Context(), c, o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig whose current context names the API server and credentials (required)")
	f.StringVar(&o.Path, "path", "/healthz", "health endpoint: /healthz, /readyz or /livez")
	f.DurationVar(&o.Timeout, "timeout", 0, "give up after this long (0: wait until stopped)")
	f.DurationVar(&o.Interval, "interval", 2*time.Second, "pause between two requests")
	_ = cmd.MarkFlagRequired("kubeconfig")
	return cmd
}
