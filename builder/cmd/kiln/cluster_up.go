package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/spf13/cobra"

	"github.com/kilnproject/kiln/builder/qemucluster"
	"github.com/kilnproject/kiln/builder/vm"
)

// clusterUpLong is `kiln cluster up --help`; %s is the default state directory.
const clusterUpLong = `Up runs a cluster on this host as kind or talosctl cluster create do: it bakes nothing but
takes the baked images DIR/<image>-control-plane.qcow2 (or .raw), DIR/<image>-worker.qcow2 and,
with --etcd-nodes, DIR/<image>-etcd.qcow2; runs cluster init (nodes NAME-cp-1..3,
NAME-etcd-1..N, NAME-worker-1..N, the API at api.internal.NAME.ZONE), gives each node a
copy-on-write disk on its image and each etcd member a blank etcd disk (serial etcd-main),
starts every VM in the background (they outlive this command; console and pid files in the
state directory), forwards each control plane's API to a port on 127.0.0.1, writes
STATE/admin.conf and waits until every node is Ready (an etcd node: until its member votes).

Topology: without --etcd-nodes each control plane runs an etcd member (a, b, c: stacked).
With --etcd-nodes 3, etcd runs on three etcd nodes (members a, b, c, 1 vCPU and 1 GiB each
unless --etcd-cpus/--etcd-memory) and the control planes' API servers use them: the external
topology, which needs far less CPU per member than a control plane.

Order: the etcd nodes start together, as an autoscaling group's machines do: the first
member is the seed and starts the etcd cluster alone, the others join it one at a time as
learners and are promoted once they caught up. Then the control planes: of three stacked
ones, the second once the first one's first boot is done, the third once the first two are
Ready (a control plane's first minutes take most of a core; several at once on a small host
time each other out); then the workers. admin.conf's current context
reaches the first control plane; it has one context per control plane too (kubectl
--context NAME-cp-2), for when the first is down.

Timings: under TCG (--accel tcg, or auto without working KVM) the cluster gets the longer
leader-election and etcd Raft timings of --slow-control-plane unless
--slow-control-plane=false: emulated control planes stall for seconds.

Network: one private link between the VMs (QEMU socket networking as kiln run --link: no
root, no bridge) with fixed addresses, 192.168.100.11-13 for the control planes,
192.168.100.21-25 for the etcd nodes and 192.168.100.101.. for the workers; the guests are
offline.

DNS: the hosts provider. Every node's config seeds /etc/hosts with every name of the cluster
(each node, etcd-<member>.internal.NAME.ZONE, and api.internal.NAME.ZONE once per control
plane). The addresses are fixed before the first boot, so every name is known in advance;
a BIND on the host would need the host's port 53 to be reachable from offline guests.

The state directory (default %s) holds cluster.json,
admin.conf, init/ (cluster init's output), and nodes/<node>/ with disk.qcow2, etcd.qcow2,
config.ign, console.log, qemu.log and qemu.pid. A second up of a cluster that exists is
refused. When the wait times out the nodes keep running: kiln cluster status shows them.`

// clusterUpExample is `kiln cluster up`'s examples.
const clusterUpExample = `  # three etcd nodes, one control plane and a worker from out/, under TCG
  kiln cluster up --name demo --etcd-nodes 3 --control-planes 1 --workers 1 --image-dir out --accel tcg
  KUBECONFIG=~/.local/state/kiln/clusters/demo/admin.conf kubectl get nodes

  # three stacked control planes and a worker, 1 vCPU each
  kiln cluster up --name demo --control-planes 3 --workers 1 --image-dir out --accel tcg \
      --cp-cpus 1 --worker-cpus 1 --timeout 90m
  KUBECONFIG=~/.local/state/kiln/clusters/demo/admin.conf kubectl --context demo-cp-2 get nodes

  # ssh into the nodes as root (kiln cluster status prints each node's ssh command)
  kiln cluster up --name demo --etcd-nodes 3 --image-dir out --ssh-key ~/.ssh/id_ed25519.pub

  # one control plane and one worker, state in ./demo
  kiln cluster up --name demo --state-dir demo --image-dir out
  kiln cluster status --state-dir demo
  kiln cluster down --state-dir demo`

// clusterUpOptions are `kiln cluster up`'s flags.
type clusterUpOptions struct {
	o        qemucluster.Options
	accel    string
	timeout  time.Duration
	sshFiles []string
}

func newClusterUpCmd() *cobra.Command {
	var u clusterUpOptions
	cmd := &cobra.Command{
		Use:     "up --name NAME [--control-planes 1|3] [--etcd-nodes 0|1|3|5] [--workers N] [--image-dir out]",
		Short:   "Boot a whole cluster of baked images in QEMU in the background and wait until every node is Ready",
		Long:    fmt.Sprintf(clusterUpLong, qemucluster.DefaultStateDir("NAME")),
		Example: clusterUpExample,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return u.run(cmd)
		},
	}
	o := &u.o
	f := cmd.Flags()
	f.StringVar(&o.Name, "name", "", "cluster name (an RFC 1123 label)")
	f.StringVar(&o.Zone, "dns-zone", qemucluster.DefaultZone, "DNS zone of the cluster's names")
	f.IntVar(&o.ControlPlanes, "control-planes", 1, "control planes: 1 or 3")
	f.IntVar(&o.Workers, "workers", 1, "workers")
	f.IntVar(&o.EtcdNodes, "etcd-nodes", 0, "etcd nodes: 1, 3 or 5 (the control planes run no member; external etcd), 0 for a member on each control plane")
	f.StringVar(&o.ImageDir, "image-dir", "out", "directory of the baked images")
	f.StringVar(&o.Image, "image", "qemu", "image name: the disks are <image>-control-plane and <image>-worker")
	f.StringVar(&o.StateDir, "state-dir", "", "state directory (default "+qemucluster.DefaultStateDir("NAME")+")")
	f.StringVar(&u.accel, "accel", "", "auto, kvm or tcg (default $KILN_ACCEL, else auto: KVM if a test boot works)")
	f.IntVar(&o.ControlPlane.CPUs, "cp-cpus", 2, "vCPUs per control plane (with 1, the control planes' preflight ignores kubeadm's 2-CPU check: node.yaml preflight.ignore [cpus])")
	f.IntVar(&o.ControlPlane.MemoryMB, "cp-memory", 3072, "MiB per control plane")
	f.IntVar(&o.Worker.CPUs, "worker-cpus", 1, "vCPUs per worker")
	f.IntVar(&o.Worker.MemoryMB, "worker-memory", 2048, "MiB per worker")
	f.IntVar(&o.Etcd.CPUs, "etcd-cpus", 1, "vCPUs per etcd node")
	f.IntVar(&o.Etcd.MemoryMB, "etcd-memory", 1024, "MiB per etcd node")
	f.IntVar(&o.WorkerNice, "worker-nice", 10, "host CPU priority of the workers' QEMU (nice 0..19): the control planes get the CPU first")
	f.StringVar(&o.EtcdDiskSize, "etcd-disk-size", "2G", "size of each etcd member's etcd disk (sparse)")
	f.IntVar(&o.APIPort, "api-port", 0, "host port of the first control plane's API, the next ones on the following ports (default: free ports)")
	f.BoolVar(&o.SlowCP, "slow-control-plane", false, "longer leader-election and etcd Raft timings, for emulated or shared CPUs (as cluster init --slow-control-plane); default on under TCG")
	f.DurationVar(&u.timeout, "timeout", 60*time.Minute, "how long to wait for every node to be Ready")
	f.StringArrayVar(&u.sshFiles, "ssh-key", nil, "public key file (authorized_keys format) root accepts on every node; enables each node's ssh server on a port of 127.0.0.1 that kiln cluster status names (repeatable)")
	cmd.MarkFlagRequired("name")
	return cmd
}

// run creates the cluster, starts every node and waits until each is Ready, printing its
// progress on the command's output.
func (u *clusterUpOptions) run(cmd *cobra.Command) error {
	o := &u.o
	ctx := cmd.Context()
	var err error
	if o.SSHKeys, err = readSSHKeys(u.sshFiles); err != nil {
		return err
	}
	if o.Accel, err = clusterAccel(ctx, u.accel, *o); err != nil {
		return err
	}
	if !cmd.Flags().Changed("slow-control-plane") {
		// Emulated CPUs stall for seconds: the default timings time out there.
		o.SlowCP = o.Accel == "tcg"
	}
	s, err := qemucluster.Create(ctx, *o, time.Now())
	if err != nil {
		return err
	}
	w := cmd.OutOrStdout()
	timings := "default timings"
	if o.SlowCP {
		timings = "slow-control-plane timings"
	}
	fmt.Fprintf(w, "cluster %s in %s (accel %s, %s, API %s)\n", s.Name, s.Dir, s.Accel, timings, s.APIEndpoint())
	var names []string
	for _, n := range s.Nodes {
		names = append(names, n.Name)
	}
	p := newProgressPrinter(w, names)
	start := time.Now()
	if err := s.StartAll(ctx, u.timeout, p.report); err != nil {
		return err
	}
	fmt.Fprintf(w, "every node Ready after %s\n  export KUBECONFIG=%s\n", time.Since(start).Round(time.Second), s.Kubeconfig())
	return nil
}

// clusterAccel resolves --accel; auto boots the control-plane image's kernel under KVM.
func clusterAccel(ctx context.Context, want string, o qemucluster.Options) (string, error) {
	if want == "" {
		want = os.Getenv("KILN_ACCEL")
	}
	if want == "kvm" || want == "tcg" {
		return want, nil
	}
	if want != "" && want != "auto" {
		return "", fmt.Errorf("--accel %q: want auto, kvm or tcg", want)
	}
	image := filepath.Join(orDefault(o.ImageDir, "out"), orDefault(o.Image, "qemu")+"-control-plane.qcow2")
	if _, err := os.Stat(image); err != nil {
		image = filepath.Join(orDefault(o.ImageDir, "out"), orDefault(o.Image, "qemu")+"-control-plane.raw")
	}
	tmp, err := os.MkdirTemp("", "kiln-accel-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	bf, err := vm.ExtractBoot(ctx, image, tmp)
	if err != nil {
		return "", fmt.Errorf("--accel auto: read the control-plane image's kernel: %w", err)
	}
	a, _, err := vm.ChooseAccel(ctx, "auto", bf.Kernel)
	return a, err
}

// readSSHKeys reads the authorized_keys lines of files: every line that is not empty or a
// comment must be a public key.
func readSSHKeys(files []string) ([]string, error) {
	var keys []string
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("--ssh-key: %w", err)
		}
		n := 0
		for i, l := range strings.Split(string(data), "\n") {
			l = strings.TrimSpace(l)
			if l == "" || strings.HasPrefix(l, "#") {
				continue
			}
			if strings.Contains(l, "PRIVATE KEY") {
				return nil, fmt.Errorf("--ssh-key %s:%d: a private key; give the public one (%s.pub)", f, i+1, f)
			}
			if _, _, _, _, err := ssh.ParseAuthorizedKey([]byte(l)); err != nil {
				return nil, fmt.Errorf("--ssh-key %s:%d: not a public key: %w", f, i+1, err)
			}
			keys = append(keys, l)
			n++
		}
		if n == 0 {
			return nil, fmt.Errorf("--ssh-key %s: no public key in it", f)
		}
	}
	return keys, nil
}
