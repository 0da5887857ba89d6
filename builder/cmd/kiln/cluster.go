package main

import (
	"fmt"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/kilnproject/kiln/builder/cluster"
	"github.com/kilnproject/kiln/initd/config"
)

func newClusterCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "cluster",
		Short: "Generate a cluster's configs (init), or run a whole cluster in QEMU (up, status, stop, start, replace, update, down)",
		Args:  cobra.NoArgs,
		RunE:  showHelp,
	}
	cmd.AddCommand(newClusterInitCmd(), newClusterUpCmd(), newClusterStatusCmd(), newClusterStopCmd(),
		newClusterStartCmd(), newClusterReplaceCmd(), newClusterUpdateCmd(), newClusterDownCmd())
	return cmd
}

// clusterInitLong is `kiln cluster init --help`.
const clusterInitLong = `Init generates what a cluster needs before its first node boots, like kubeadm init and
talosctl gen config together: the cluster CA, front-proxy CA, etcd CA and service-account key
(kubeadm layout in DIR/pki), DIR/admin.conf, DIR/bootstrap-token, DIR/cluster.yaml and one
Ignition config per node, DIR/<node>.ign. Boot each node's image with its .ign (kiln run
--config, or the platform's user data).

Nodes are <name>-cp-1..3 (etcd members a, b, c) and <name>-worker-1..N. A control plane's
config carries the CA keys, the service-account key, the bootstrap token and its node.yaml;
kiln-init makes the leaf certificates and kubeconfigs at first boot. A worker's carries the
CA certificate and a bootstrap kubeconfig for TLS bootstrapping.

With --etcd-nodes N (1, 3 or 5) etcd runs on its own nodes, <name>-etcd-1..N (members a, b,
c, ...), each with its disk, and the control planes run no member: their API servers use
https://etcd-<member>.internal.<name>.<zone>:2379 (node.yaml etcd.external), kubeadm's
external etcd topology. An etcd node's config carries the etcd CA and its node.yaml only.

The first member (a) is the seed: it starts a one-member etcd cluster, and the others join it
one at a time as learners, each promoted once it caught up, so the nodes may boot in any
order or all at once.

Secrets are written 0600 and DIR is 0700. DIR is built beside itself and renamed into place;
an existing non-empty DIR is refused unless --force.`

// clusterInitExample is `kiln cluster init`'s examples.
const clusterInitExample = `  # one control plane, one worker, API on the default name api.internal.demo.k8s.example.com
  kiln cluster init --name demo --dns-zone k8s.example.com -o demo
  kiln run out/qemu-control-plane.qcow2 --config demo/demo-cp-1.ign

  # three control planes behind a fixed address, three workers, etcd on the disk with serial etcd-main
  kiln cluster init --name prod --dns-zone k8s.example.com --control-planes 3 --workers 3 \
      --api-endpoint 10.0.0.10:6443 -o prod

  # reach the API through a forwarded port from the host
  kiln cluster init --name e2e --dns-zone test --api-endpoint 192.168.100.11:6443 \
      --admin-server https://127.0.0.1:16443 -o e2e
  KUBECONFIG=e2e/admin.conf kubectl get nodes

  # three etcd nodes (each with its etcd disk) and three control planes that use them
  kiln cluster init --name prod --dns-zone k8s.example.com --etcd-nodes 3 --control-planes 3 -o prod

  # control planes on emulated CPUs (kiln run --accel tcg): leader leases that survive stalls
  kiln cluster init --name demo --dns-zone kiln.test --slow-control-plane -o demo`

func newClusterInitCmd() *cobra.Command {
	var (
		s     cluster.Spec
		out   string
		force bool
	)
	cmd := &cobra.Command{
		Use:     "init --name NAME --dns-zone ZONE -o DIR",
		Short:   "Write a new cluster's CAs, admin kubeconfig, bootstrap token and one Ignition config per node",
		Long:    clusterInitLong,
		Example: clusterInitExample,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := cluster.Init(out, s, force, time.Now())
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "wrote cluster %s to %s (API %s)\n", c.Spec.Name, out, c.Spec.APIEndpoint)
			for _, n := range c.Nodes {
				fmt.Fprintf(w, "  %-12s %s\n", n.Role, filepath.Join(out, n.Ignition))
			}
			fmt.Fprintf(w, "  %-12s %s\n", "admin", filepath.Join(out, cluster.AdminKubeconfigFile))
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&s.Name, "name", "", "cluster name (an RFC 1123 label); nodes are <name>-cp-<i> and <name>-worker-<i>")
	f.StringVar(&s.DNSZone, "dns-zone", "", "DNS zone of the cluster's names, <host>.internal.<name>.<zone>")
	f.IntVar(&s.ControlPlanes, "control-planes", 1, "number of control-plane nodes: 1 or 3")
	f.IntVar(&s.Workers, "workers", cluster.DefaultWorkers, "number of worker nodes")
	f.IntVar(&s.EtcdNodes, "etcd-nodes", 0, "number of dedicated etcd nodes: 1, 3 or 5 (external etcd); 0 runs a member on each control plane")
	f.StringVar(&s.APIEndpoint, "api-endpoint", "", "host:port of the Kubernetes API (default api.internal.<name>.<zone>:6443)")
	f.StringVar(&s.EtcdDiskSerial, "etcd-disk-serial", cluster.DefaultEtcdDiskSerial, `serial of each etcd member's disk, on a control plane or an etcd node ("" keeps etcd on /var)`)
	f.StringVar(&s.KubernetesVersion, "kubernetes-version", cluster.DefaultKubernetesVersion, "Kubernetes version")
	f.StringVar(&s.PodCIDR, "pod-cidr", config.DefaultPodCIDR, `pod network range ("v4,v6" for dual stack)`)
	f.StringVar(&s.ServiceCIDR, "service-cidr", config.DefaultServiceCIDR, `service range ("v4,v6" for dual stack)`)
	f.StringVar(&s.AdminServer, "admin-server", "", "server URL in admin.conf (default https://<api-endpoint>)")
	f.StringVar(&s.AdminTLSServerName, "admin-tls-server-name", "", "tls-server-name in admin.conf, for an --admin-server whose host the API certificate does not name")
	f.BoolVar(&s.SlowControlPlane, "slow-control-plane", false, "longer leader-election timings (60s/40s/5s) and etcd Raft timings (heartbeat 500ms, election 5s) for control planes on slow or shared CPUs, e.g. QEMU without KVM")
	f.StringSliceVar(&s.ControlPlanePreflightIgnore, "cp-ignore-preflight", nil, "preflight checks whose failure does not stop a control plane's first boot (node.yaml preflight.ignore), e.g. cpus for one vCPU")
	f.StringVarP(&out, "output", "o", "", "output directory (created; must be empty or absent unless --force)")
	f.BoolVar(&force, "force", false, "replace a non-empty output directory")
	cmd.MarkFlagRequired("name")
	cmd.MarkFlagRequired("dns-zone")
	cmd.MarkFlagRequired("output")
	return cmd
}
