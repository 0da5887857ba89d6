package qemucluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/kilnproject/kiln/builder/cluster"
	"github.com/kilnproject/kiln/builder/vm"
	"github.com/kilnproject/kiln/internal/atomicfile"
	"github.com/kilnproject/kiln/internal/exitcode"
	"github.com/kilnproject/kiln/internal/kubeconfig"
)

// Create lays out a new cluster in o.StateDir: cluster init, a copy-on-write disk per
// node, an etcd disk per etcd member (stacked control plane or etcd node), each node's
// config, admin.conf and cluster.json.
// It starts nothing. A state directory that holds a cluster, or anything, is refused; one
// that Create made is removed again when Create fails.
func Create(ctx context.Context, o Options, now time.Time) (*State, error) {
	o, err := o.withDefaults()
	if err != nil {
		return nil, exitcode.Usage(err)
	}
	if err := refuseExisting(o.StateDir, o.Name); err != nil {
		return nil, err
	}
	cpImage, err := findImage(o.ImageDir, o.Image, RoleControlPlane)
	if err != nil {
		return nil, err
	}
	workerImage, etcdImage := "", ""
	if o.Workers > 0 {
		if workerImage, err = findImage(o.ImageDir, o.Image, RoleWorker); err != nil {
			return nil, err
		}
	}
	if o.EtcdNodes > 0 {
		if etcdImage, err = findImage(o.ImageDir, o.Image, RoleEtcd); err != nil {
			return nil, err
		}
	}
	// One pick of free ports for all, so that no two are the same.
	sshPorts := 0
	if len(o.SSHKeys) > 0 {
		sshPorts = o.EtcdNodes + o.ControlPlanes + o.Workers
	}
	free, err := apiPorts(0, o.ControlPlanes+o.members()+sshPorts)
	if err != nil {
		return nil, err
	}
	ports, etcdPorts, ssh := free[:o.ControlPlanes], free[o.ControlPlanes:o.ControlPlanes+o.members()], free[o.ControlPlanes+o.members():]
	if o.APIPort != 0 {
		if ports, err = apiPorts(o.APIPort, o.ControlPlanes); err != nil {
			return nil, err
		}
	}
	s := &State{Name: o.Name, Zone: o.Zone, Accel: o.Accel, Link: linkName(o.Name), EtcdDiskSize: o.EtcdDiskSize,
		Nodes: plan(o, ports, etcdPorts), Dir: o.StateDir, SSHKeys: o.SSHKeys}
	for i := range ssh {
		s.Nodes[i].SSHPort = ssh[i]
	}
	s.Images.ControlPlane, s.Images.Worker, s.Images.Etcd = cpImage, workerImage, etcdImage

	if err := os.MkdirAll(o.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("state directory: %w", err)
	}
	if err := s.create(ctx, o, now); err != nil {
		// The directory was absent or empty: nothing of anyone else's is lost.
		os.RemoveAll(o.StateDir)
		return nil, err
	}
	return s, nil
}

func (s *State) create(ctx context.Context, o Options, now time.Time) error {
	spec := cluster.Spec{Name: o.Name, DNSZone: o.Zone, ControlPlanes: o.ControlPlanes, Workers: o.Workers, EtcdNodes: o.EtcdNodes,
		EtcdDiskSerial: EtcdDiskSerial, SlowControlPlane: o.SlowCP, ControlPlanePreflightIgnore: cpPreflightIgnore(o.ControlPlane),
		AdminServer: fmt.Sprintf("https://127.0.0.1:%d", s.firstAPIPort()), AdminTLSServerName: apiTLSName}
	c, err := cluster.Init(s.initDir(), spec, false, now)
	if err != nil {
		return fmt.Errorf("cluster init: %w", err)
	}
	if err := s.writeEtcdClient(now); err != nil {
		return fmt.Errorf("the host's etcd client certificate: %w", err)
	}
	if len(c.Nodes) != len(s.Nodes) {
		return fmt.Errorf("cluster init made %d nodes, the plan has %d", len(c.Nodes), len(s.Nodes))
	}
	for i := range s.Nodes {
		n := &s.Nodes[i]
		if c.Nodes[i].Name != n.Name || c.Nodes[i].EtcdMember != n.EtcdMember {
			return fmt.Errorf("cluster init's node %d is %s (member %q), the plan's %s", i, c.Nodes[i].Name, c.Nodes[i].EtcdMember, n.Name)
		}
		if err := os.MkdirAll(s.nodeDir(n.Name), 0o700); err != nil {
			return err
		}
		if err := s.writeNodeConfig(n, filepath.Join(s.initDir(), c.Nodes[i].Ignition)); err != nil {
			return err
		}
		if err := s.freshDisks(ctx, n); err != nil {
			return err
		}
	}
	admin, err := os.ReadFile(filepath.Join(s.initDir(), cluster.AdminKubeconfigFile))
	if err != nil {
		return err
	}
	if admin, err = s.contextPerControlPlane(admin); err != nil {
		return fmt.Errorf("%s: %w", cluster.AdminKubeconfigFile, err)
	}
	if err := atomicfile.Write(s.Kubeconfig(), admin, atomicfile.Options{Mode: 0o600}); err != nil {
		return err
	}
	return s.save()
}

// firstAPIPort is the host port of the first control plane's API.
func (s *State) firstAPIPort() int {
	for _, n := range s.Nodes {
		if n.APIPort != 0 {
			return n.APIPort
		}
	}
	return 0
}

// RootDiskSize is the least size of a node's root disk: the baked image is only as large as
// its partitions, and first boot gives the rest to the data partition (/var).
const RootDiskSize = "4G"

// freshDisks (re)creates node n's root disk as a copy-on-write overlay on its baked image,
// grown to RootDiskSize, and, on an etcd member, a blank sparse etcd disk.
func (s *State) freshDisks(ctx context.Context, n *Node) error {
	image := map[string]string{RoleControlPlane: s.Images.ControlPlane, RoleWorker: s.Images.Worker, RoleEtcd: s.Images.Etcd}[n.Role]
	format := "raw"
	if strings.HasSuffix(image, ".qcow2") {
		format = "qcow2"
	}
	disk := s.nodeFile(n.Name, diskFile)
	os.Remove(disk)
	if err := vm.QEMUImg(ctx, "create", "-q", "-f", "qcow2", "-F", format, "-b", image, disk); err != nil {
		return fmt.Errorf("node %s: disk: %w", n.Name, err)
	}
	if _, err := vm.GrowDisk(ctx, disk, RootDiskSize); err != nil {
		return fmt.Errorf("node %s: disk: %w", n.Name, err)
	}
	if n.EtcdMember != "" {
		etcd := s.EtcdDisk(n.Name)
		os.Remove(etcd)
		if err := vm.QEMUImg(ctx, "create", "-q", "-f", "qcow2", etcd, s.EtcdDiskSize); err != nil {
			return fmt.Errorf("node %s: etcd disk: %w", n.Name, err)
		}
	}
	// A fresh machine has fresh UEFI variables and an empty console.
	os.Remove(s.nodeFile(n.Name, "OVMF_VARS.fd"))
	return nil
}

// findImage is dir/<stem>-<role>.qcow2 (or .raw), as an absolute path.
func findImage(dir, stem, role string) (string, error) {
	if dir == "" {
		dir = "out"
	}
	var tried []string
	for _, ext := range []string{".qcow2", ".raw"} {
		p := filepath.Join(dir, stem+"-"+role+ext)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
			return filepath.Abs(p)
		}
		tried = append(tried, p)
	}
	return "", fmt.Errorf("no %s image: none of %s (bake one: kiln bake images/%s.yaml --role %s -o %s; or name the directory with --image-dir)",
		role, strings.Join(tried, ", "), stem, role, dir)
}

// apiPorts are n host ports from first on, or n free ones when first is 0 (the API's, and
// the etcd nodes' client ports).
func apiPorts(first, n int) ([]int, error) {
	var ports []int
	if first != 0 {
		for i := range n {
			ports = append(ports, first+i)
		}
		return ports, nil
	}
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("pick an API port: %w", err)
		}
		defer l.Close() // held until all are picked, so they differ
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// Progress is told each node's phase as it changes: started, first boot ok|failed|done
// already, registered (the API knows the node), Ready, NotReady.
type Progress func(node, phase string)

// StartAll starts every stopped node: the etcd nodes, then the control planes, then the
// workers once every control plane is Ready (as a worker of a real cluster joins one that
// serves).
//
// The etcd nodes start together, as machines of an autoscaling group do: the seed starts the
// etcd cluster alone and the others join it one at a time as learners (initd/etcdmember), or,
// after a power cut, every member starts with its data and they find each other; the control
// planes follow once every member votes. Of several control planes, the first ones that make
// an etcd quorum start each once the previous one's first boot is done (after a power cut
// none serves before a quorum of them runs), and the others each once the control planes
// before them are Ready: a control plane's first minutes (etcd and the API server starting,
// the API server's bootstrap) take more CPU than the rest of its life, and on a host with
// few cores several at once starved each other until etcd and the API servers timed each
// other out.
func (s *State) StartAll(ctx context.Context, timeout time.Duration, progress Progress) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	byRole := map[string][]string{}
	for _, n := range s.Nodes {
		byRole[n.Role] = append(byRole[n.Role], n.Name)
	}
	if etcd := byRole[RoleEtcd]; len(etcd) > 0 {
		for _, n := range etcd {
			if err := s.startReported(ctx, n, progress); err != nil {
				return err
			}
		}
		if err := s.wait(ctx, etcd, untilVoting, progress); err != nil {
			return err
		}
	}
	cps := byRole[RoleControlPlane]
	quorum := len(cps)/2 + 1
	if len(byRole[RoleEtcd]) > 0 {
		quorum = 1 // their etcd runs already
	}
	for i, n := range cps {
		if err := s.startReported(ctx, n, progress); err != nil {
			return err
		}
		switch {
		case i+1 == len(cps):
		case i+1 < quorum:
			if err := s.wait(ctx, []string{n}, untilFirstBoot, progress); err != nil {
				return err
			}
		default:
			if err := s.wait(ctx, cps[:i+1], untilReady, progress); err != nil {
				return err
			}
		}
	}
	if err := s.wait(ctx, cps, untilReady, progress); err != nil {
		return err
	}
	for _, n := range byRole[RoleWorker] {
		if err := s.startReported(ctx, n, progress); err != nil {
			return err
		}
	}
	return s.wait(ctx, byRole[RoleWorker], untilReady, progress)
}

// startReported starts node (left alone when it runs) and reports it.
func (s *State) startReported(ctx context.Context, node string, progress Progress) error {
	running := s.Running(node) != 0
	if err := s.StartNode(ctx, node); err != nil {
		return err
	}
	if running {
		progress(node, "running")
	} else {
		progress(node, "started")
	}
	return nil
}

// What a wait waits for.
type until int

const (
	untilReady     until = iota // the node is Ready since its VM started
	untilFirstBoot              // the node's latest boot printed its first-boot status line
	untilVoting                 // the node's latest boot printed that its etcd member votes
)

// goalOf is what a node's wait waits for: an etcd node is no Kubernetes node, its member
// voting is what it is up for.
func (s *State) goalOf(node string, goal until) until {
	if n, err := s.Node(node); err == nil && n.Role == RoleEtcd && goal == untilReady {
		return untilVoting
	}
	return goal
}

// WaitReady waits until every node in names is Ready, reporting phases, or ctx ends. A
// node whose QEMU exits or whose first boot fails ends the wait with its console's tail.
func (s *State) WaitReady(ctx context.Context, names []string, progress Progress) error {
	return s.wait(ctx, names, untilReady, progress)
}

// wait waits until every node in names has reached goal, reporting phases, or ctx ends.
func (s *State) wait(ctx context.Context, names []string, goal until, progress Progress) error {
	phase := map[string]string{}
	set := func(n, p string) {
		if phase[n] != p {
			phase[n] = p
			progress(n, p)
		}
	}
	for {
		api, err := s.apiClient()
		if err != nil {
			return err
		}
		rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		ready, apiErr := api.nodeReady(rctx)
		cancel()
		done := true
		for _, n := range names {
			if s.Running(n) == 0 {
				return fmt.Errorf("node %s: QEMU is not running; its console:\n%s", n, s.consoleTail(n, 20))
			}
			c := s.console(n)
			if strings.HasPrefix(c.FirstBoot, "failed") {
				return fmt.Errorf("node %s: first boot %s; console %s:\n%s", n, c.FirstBoot, s.ConsoleLog(n), s.consoleTail(n, 20))
			}
			if s.goalOf(n, goal) == untilVoting {
				switch {
				case c.Etcd == etcdVoting:
					set(n, "etcd member voting")
					continue
				case c.Etcd != "":
					set(n, "etcd member "+c.Etcd)
				case c.FirstBoot != "":
					set(n, "first boot "+c.FirstBoot)
				}
				done = false
				continue
			}
			// A node that was Ready before this boot still shows its old condition until its
			// kubelet reports again: only a report since the VM started counts.
			switch r, ok := ready[n]; {
			case ok && r.readySince(s.startedAt(n)):
				set(n, "Ready")
				continue
			case ok:
				set(n, "registered, not Ready")
			case c.FirstBoot != "":
				set(n, "first boot "+c.FirstBoot)
			}
			if goal == untilFirstBoot && c.FirstBoot != "" {
				continue
			}
			done = false
		}
		if done {
			return nil
		}
		select {
		case <-ctx.Done():
			var waiting []string
			for _, n := range names {
				if phase[n] != "Ready" && phase[n] != "etcd member voting" {
					waiting = append(waiting, fmt.Sprintf("%s (%s)", n, or(phase[n], "booting")))
				}
			}
			what := map[until]string{untilReady: "not Ready in time", untilFirstBoot: "first boot not done in time",
				untilVoting: "etcd member not voting in time"}[goal]
			msg := fmt.Sprintf("%s: %s", what, strings.Join(waiting, ", "))
			if apiErr != nil {
				msg += fmt.Sprintf("; the API: %v", apiErr)
			}
			return exitcode.Timeout(errors.New(msg + " (the nodes keep running: kiln cluster status; consoles in " + filepath.Join(s.Dir, "nodes") + ")"))
		case <-time.After(5 * time.Second):
		}
	}
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// ReplaceNode stops node and gives it a fresh root disk (the baked image again), a blank
// etcd disk on a control plane, and fresh UEFI variables: a new machine with the same name,
// address and config. It does not start it.
func (s *State) ReplaceNode(ctx context.Context, name string) error {
	n, err := s.Node(name)
	if err != nil {
		return err
	}
	if err := s.StopNode(name, 30*time.Second); err != nil {
		return err
	}
	return s.freshDisks(ctx, n)
}

// Down stops every node and, unless keep, removes the state directory.
func (s *State) Down(keep bool) error {
	var errs []error
	for _, n := range s.Nodes {
		if err := s.StopNode(n.Name, 30*time.Second); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if keep {
		return nil
	}
	if err := os.RemoveAll(s.Dir); err != nil {
		return fmt.Errorf("remove %s: %w", s.Dir, err)
	}
	return nil
}

// WaitReadyFor is WaitReady bounded by timeout.
func (s *State) WaitReadyFor(ctx context.Context, names []string, timeout time.Duration, progress Progress) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return s.WaitReady(ctx, names, progress)
}

// startedAt is when node's VM was started (its pid file written); the zero time when unknown.
func (s *State) startedAt(node string) time.Time {
	fi, err := os.Stat(s.pidFile(node))
	if err != nil {
		return time.Time{}
	}
	// The API's times have whole seconds.
	return fi.ModTime().Truncate(time.Second)
}

// readySince reports whether the condition says Ready in a report made at or after started.
func (r readyCondition) readySince(started time.Time) bool {
	return r.Status == "True" && !r.Heartbeat.Before(started)
}

// contextPerControlPlane adds to admin.conf one context per control plane, named after the
// node, whose server is that node's forwarded API port: the current context reaches the
// first control plane, and `kubectl --context <cluster>-cp-2` another while it is down.
func (s *State) contextPerControlPlane(admin []byte) ([]byte, error) {
	f, err := kubeconfig.Decode(admin)
	if err != nil {
		return nil, err
	}
	for _, n := range s.Nodes {
		if n.Role != RoleControlPlane {
			continue
		}
		if err := f.AddServerContext(n.Name, fmt.Sprintf("https://127.0.0.1:%d", n.APIPort)); err != nil {
			return nil, err
		}
	}
	return f.Encode()
}

// cpPreflightIgnore is what the control planes' preflight may fail: kubeadm wants two CPUs for
// a control plane, and one vCPU each is what lets three control planes share a small host
// (make e2e-ha). The check still runs and kiln-init status shows it failed.
func cpPreflightIgnore(cp Size) []string {
	if cp.CPUs < 2 {
		return []string{"cpus"}
	}
	return nil
}
