package firstboot

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/kilnproject/kiln/initd/apply"
	"github.com/kilnproject/kiln/initd/config"
	"github.com/kilnproject/kiln/initd/etcdmember"
	"github.com/kilnproject/kiln/initd/firstboot/facts"
	"github.com/kilnproject/kiln/initd/firstboot/preflight"
	"github.com/kilnproject/kiln/initd/firstboot/render"
	"github.com/kilnproject/kiln/initd/kube"
	"github.com/kilnproject/kiln/initd/pki"
	"github.com/kilnproject/kiln/initd/task"
	"github.com/kilnproject/kiln/internal/nodeimage"
	"github.com/kilnproject/kiln/internal/poll"
)

// plan is one first boot's task graph and what its tasks learn on the way. Its tasks, each
// arrow a dependency the task declares:
//
//	storage ─► users ─► directories ─► files ─┬─► links ─► units ─► systemd
//	                                          ├─► network ─────┐
//	                                          └─► node-config ─┴─► facts ─► hostname ─► preflight
//
//	preflight ─┬─► pki ─────────┬─► etcd-join ─► render ─┬─► etcd-manifest ─► kubelet
//	           └─► etcd-volume ─┘                        │
//	                                                      (etcd-manifest also on etcd-volume;
//	                                                       kubelet also on render and pki)
//
//	storage ─► containerd-store ─► kubelet
//
// storage (the config's disks, arrays, LUKS volumes and filesystems) comes first, so that
// homes, directories, files and containerd's store may land on the filesystems it mounts.
//
// Some tasks also declare a dependency an arrow path already gives them: files on users and storage,
// units on files, render on node-config, kubelet on render.
//
// kubelet hands over to the units that run after first boot: containerd, kiln-images,
// kubelet, kiln-cni and (control plane) kiln-control-plane. A plain node (see
// runsKubernetes) has the first graph only.
type plan struct {
	opts      Options
	cfg       *config.Config
	imageRole string
	runtime   nodeimage.Runtime // the image's container runtime (image.json)
	platform  string            // kiln.platform: aws and gce nodes learn who they are from the metadata service

	instance *instance // what the platform's metadata service says, read once by the facts task

	files []config.File
	node  *config.Node
	facts *facts.Facts
	pre   *preflight.Report

	etcdPlan    *etcdmember.Plan // how this etcd member starts, when etcd-join asked the others
	etcdWaiting atomic.Value     // string: why this member cannot start yet (etcd-join's wait)

	rerun          bool     // an earlier first boot ran here (its own manifests may be present)
	reload         bool     // units changed: systemd must re-read them
	networkChanged bool     // the config wrote systemd-networkd files: networkd must re-read them
	enabledUnits   []string // units the config enables, started in this boot
}

func newPlan(opts Options, cfg *config.Config, imageRole string) *plan {
	return &plan{opts: opts, cfg: cfg, imageRole: imageRole}
}

// tasks is the graph, in the order the data flows: the Ignition config onto the node, the
// node's own config and facts, then, unless the node is a plain one, its Kubernetes parts.
func (p *plan) tasks() []task.Task {
	node := slices.Concat(p.ignitionTasks(), p.nodeTasks())
	if !p.runsKubernetes() {
		return node
	}
	return slices.Concat(
		node,
		p.kubeConfigTasks(),
		p.etcdTasks(),
		p.pkiTasks(),
		p.kubeletTasks(),
	)
}

// runsKubernetes reports whether first boot configures Kubernetes on this image: one baked
// for a Kubernetes role (config.Roles), or one without image.json, whose node config says
// what it is. An image baked for a role of any other name is a plain node: the bake lays no
// Kubernetes parts into it, and first boot applies its config and nothing more.
func (p *plan) runsKubernetes() bool {
	return p.imageRole == "" || config.Role(p.imageRole).Known()
}

// ignitionTasks apply the Ignition config: accounts, then the filesystem, then what the
// running networkd and systemd must learn of it.
func (p *plan) ignitionTasks() []task.Task {
	return []task.Task{
		task.Converge("storage", nil, p.applyStorage),
		task.Converge("users", []string{"storage"}, p.applyUsers),
		task.Converge("directories", []string{"users"}, p.applyDirectories),
		task.Converge("files", []string{"storage", "users", "directories"}, p.applyFiles),
		task.Converge("network", []string{"files"}, p.reloadNetwork),
		task.Converge("links", []string{"files"}, p.applyLinks),
		task.Converge("units", []string{"files", "links"}, p.applyUnits),
		task.Converge("systemd", []string{"units"}, p.startUnits),
	}
}

// nodeTasks learn what node this is: its node config (the config may just have written
// it), the machine's facts and, from both, its hostname.
func (p *plan) nodeTasks() []task.Task {
	return []task.Task{
		task.Converge("node-config", []string{"files"}, p.loadNode),
		task.Converge("facts", []string{"node-config", "network"}, p.gatherFacts),
		task.Converge("hostname", []string{"facts"}, p.setHostname),
	}
}

// kubeConfigTasks check the machine for the node's role and write the role's
// configuration from its templates.
func (p *plan) kubeConfigTasks() []task.Task {
	return []task.Task{
		task.Converge("preflight", []string{"facts", "hostname"}, p.preflight),
		task.Converge("render", []string{"preflight", "node-config", "etcd-join"}, p.render),
	}
}

// changedAny adapts an applier's list of changed paths to a Converge step's result.
func changedAny(paths []string, err error) (bool, error) { return len(paths) > 0, err }

func (p *plan) applyUsers(ctx context.Context) (bool, error) {
	pw := p.cfg.Ignition.Passwd
	return changedAny(apply.Users(ctx, p.opts.Root, pw.Users, pw.Groups))
}

func (p *plan) applyDirectories(ctx context.Context) (bool, error) {
	return changedAny(apply.Directories(ctx, p.opts.Root, p.cfg.Ignition.Storage.Directories))
}

// applyFiles writes the config's files (Ignition's and the Butane sugar's) and notes
// whether any of them is networkd's.
func (p *plan) applyFiles(ctx context.Context) (bool, error) {
	files, err := p.cfg.Files()
	if err != nil {
		return false, err
	}
	p.files = files
	changed, err := apply.Files(ctx, p.opts.Root, files, nil)
	for _, c := range changed {
		if strings.HasPrefix(c, networkDir) {
			p.networkChanged = true
		}
	}
	return len(changed) > 0, err
}

func (p *plan) applyLinks(ctx context.Context) (bool, error) {
	return changedAny(apply.Links(ctx, p.opts.Root, p.cfg.Ignition.Storage.Links))
}

// applyUnits writes the config's units and drop-ins and notes whether systemd must re-read
// them.
func (p *plan) applyUnits(ctx context.Context) (bool, error) {
	changed, reload, err := apply.Units(ctx, p.opts.Root, p.cfg.Ignition.Systemd.Units)
	p.reload = p.reload || reload
	return len(changed) > 0, err
}

// startUnits makes the running systemd see the config's units and starts the enabled ones in
// this boot: first boot runs after systemd planned the boot, so enabling alone would wait for
// the next one.
func (p *plan) startUnits(ctx context.Context) (bool, error) {
	for _, u := range p.cfg.Ignition.Systemd.Units {
		if u.Enabled != nil && *u.Enabled && (u.Mask == nil || !*u.Mask) {
			p.enabledUnits = append(p.enabledUnits, u.Name)
		}
	}
	if !p.reload {
		return false, nil // nothing new for systemd: a re-run does not restart anything
	}
	if err := p.opts.Systemctl(ctx, "daemon-reload"); err != nil {
		return false, err
	}
	if len(p.enabledUnits) > 0 {
		// --no-block: units ordered after kiln-firstboot must not wait for us to exit.
		// "--": the names come from the config and must never be read as options.
		args := append([]string{"start", "--no-block", "--"}, p.enabledUnits...)
		if err := p.opts.Systemctl(ctx, args...); err != nil {
			return false, err
		}
	}
	return true, nil
}

// networkDir holds systemd-networkd's configuration; files the config writes there
// (a static address, say) apply in this boot.
const networkDir = "/etc/systemd/network/"

// reloadNetwork makes the running systemd-networkd apply the .network files the config
// wrote — it started before first boot and does not watch for new files — and waits
// (bounded) until no link is still being configured, so the facts see the final addresses.
func (p *plan) reloadNetwork(ctx context.Context) (bool, error) {
	if !p.networkChanged {
		return false, nil
	}
	if _, err := p.opts.Networkctl(ctx, "reload"); err != nil {
		return false, err
	}
	var out string
	err := poll.Until(ctx, poll.Options{What: "networkd to configure the links", Timeout: 30 * time.Second,
		Backoff: poll.Constant(250 * time.Millisecond), Retryable: func(error) bool { return false }},
		func(ctx context.Context) (bool, error) {
			var err error
			out, err = p.opts.Networkctl(ctx, "list", "--no-legend", "--no-pager")
			return err == nil && !strings.Contains(out, "configuring"), err
		})
	var pe *poll.Error
	switch {
	case errors.Is(err, poll.ErrTimeout):
		p.opts.Log.Warn("network still configuring after 30s; going on", "links", strings.TrimSpace(out))
		return true, nil
	case errors.As(err, &pe):
		return true, ctx.Err()
	}
	return true, err
}

// loadNode reads /etc/kiln/node.yaml (the config may just have written it). Without one the
// node is what the image was baked for. A node config for another role than the image's is
// an error: the image does not carry that role's parts. A plain node takes none.
func (p *plan) loadNode(context.Context) (bool, error) {
	n, err := config.LoadNodeIn(p.opts.Root)
	switch {
	case errors.Is(err, fs.ErrNotExist) && !p.runsKubernetes():
		n = &config.Node{}
	case errors.Is(err, fs.ErrNotExist):
		n = &config.Node{Role: config.Role(p.imageRole)}
	case !p.runsKubernetes():
		return false, p.plainNodeConfig(n, err)
	case err != nil:
		return false, err
	case p.imageRole != "" && string(n.Role) != p.imageRole:
		return false, fmt.Errorf("%s: role %s, but this image was baked for %s", nodeimage.NodeConfigPath, n.Role, p.imageRole)
	}
	p.node = n
	return false, nil
}

// plainNodeConfig is the error for a node config (n, or the error reading it) on a plain
// node: it names the file and, when the file reads, its role.
func (p *plan) plainNodeConfig(n *config.Node, err error) error {
	why := fmt.Sprintf("this image was baked for %s, a node without Kubernetes, and takes no node config", p.imageRole)
	if err != nil {
		return fmt.Errorf("%s: %w", why, err)
	}
	return fmt.Errorf("%s: role %s: %s", nodeimage.NodeConfigPath, n.Role, why)
}

// factAddress is the fact a Kubernetes node cannot be configured without: its address,
// which DHCP may hand out well after first boot started (a slow server, spanning tree on
// the switch port).
const factAddress = "an IPv4/IPv6 address on a link (DHCP)"

// needsAddress reports whether a node of role needs an address at first boot: kubelet's
// --node-ip, a control plane's certificates and etcd's URLs carry it.
func needsAddress(role config.Role) bool {
	return role == config.RoleWorker || role == config.RoleControlPlane || role == config.RoleEtcd
}

// facts are what the task runner waits for when a task lacks them (task.UnknownError):
// the node's address, learnt by the facts task, and, on an etcd member of several, a
// running cluster that takes it, learnt by etcd-join (with a bound of its own).
func (p *plan) factList() []task.Fact {
	facts := []task.Fact{{Name: factAddress, Task: "facts", Await: p.awaitAddress}}
	if p.runsKubernetes() {
		facts = append(facts, task.Fact{Name: factEtcdCluster, Task: "etcd-join", Await: p.awaitEtcdCluster,
			Limit: etcdJoinWait, Detail: p.etcdWaitDetail})
	}
	return facts
}

// factsOptions are facts.Gather's options for this node.
func (p *plan) factsOptions() facts.Options {
	name := p.node.Hostname
	if name == "" {
		for _, f := range p.files {
			if f.Path == "/etc/hostname" && f.HasContents {
				name = strings.TrimSpace(string(f.Contents))
			}
		}
	}
	o := facts.Options{Root: p.opts.Root, ProcRoot: p.opts.Facts.ProcRoot,
		SysRoot: p.opts.Facts.SysRoot, Hostname: name, Addrs: p.opts.Facts.Addrs}
	if p.instance != nil {
		o.Platform = platformFacts(*p.instance)
	}
	return o
}

// gatherFacts reads the machine and, on aws and gce, asks the metadata service who the
// instance is (once). The hostname the config chose wins: node.yaml's, else an
// /etc/hostname the config wrote (the Ignition way of naming a node), else the platform's.
// A Kubernetes node without an address yet fails with task.Unknown: the runner waits
// (bounded) for the address and runs this task and those after it again.
func (p *plan) gatherFacts(ctx context.Context) (bool, error) {
	if p.instance == nil {
		in, err := readInstance(ctx, p.platform, p.node)
		if err != nil {
			return false, err
		}
		p.instance = &in
	}
	f, err := facts.Gather(ctx, p.factsOptions())
	if err != nil {
		return false, err
	}
	p.facts = f
	if f.IPv4 == "" && f.IPv6 == "" && needsAddress(p.node.Role) {
		return false, task.Unknown(factAddress, fmt.Errorf("a %s node needs its IP address", p.node.Role))
	}
	return false, nil
}

// awaitAddress blocks until the machine has an address facts.Gather takes for the node's.
func (p *plan) awaitAddress(ctx context.Context) error {
	o := p.factsOptions()
	err := poll.Until(ctx, poll.Options{What: factAddress, Backoff: poll.Constant(250 * time.Millisecond)},
		func(ctx context.Context) (bool, error) {
			f, err := facts.Gather(ctx, o)
			return err == nil && (f.IPv4 != "" || f.IPv6 != ""), nil
		})
	if err != nil {
		return ctx.Err()
	}
	return nil
}

// setHostname makes the chosen hostname the node's, now and on later boots.
func (p *plan) setHostname(ctx context.Context) (bool, error) {
	name := p.facts.Hostname
	path := filepath.Join(p.opts.Root, "etc/hostname")
	if cur, err := os.ReadFile(path); err == nil && strings.TrimSpace(string(cur)) == name {
		return false, nil
	}
	if _, err := apply.Files(ctx, p.opts.Root, []config.File{{Field: "hostname", Path: "/etc/hostname",
		Mode: 0o644, ModeSet: true, Overwrite: true, HasContents: true, Contents: []byte(name + "\n")}}, nil); err != nil {
		return false, err
	}
	if p.opts.Root == "/" {
		if err := p.opts.Systemctl(ctx, "restart", "--no-block", "systemd-hostnamed.service"); err != nil {
			p.opts.Log.Warn("hostnamed restart", "error", err)
		}
		if err := setKernelHostname(name); err != nil {
			return false, err
		}
	}
	return true, nil
}

// preflight runs kubeadm's checks for the node's role. The runtime is not up yet at first
// boot, so its socket is not asked; `kiln-init preflight` run later asks it.
func (p *plan) preflight(ctx context.Context) (bool, error) {
	role := string(p.node.Role)
	if role == "" {
		return false, nil // an image without a role: nothing Kubernetes to check
	}
	ignore := slices.Concat(p.opts.PreflightIgnore, p.node.Preflight.Ignore)
	if p.rerun {
		// The manifests and etcd data an earlier run left are kiln's own.
		ignore = append(append([]string{}, ignore...), "manifests-dir", "etcd-data-dir")
	}
	etcdDir := ""
	if p.etcdMember() && p.node.Etcd.Volume != nil {
		etcdDir = p.node.Etcd.Volume.MountPath
	}
	rep, err := preflight.Run(ctx, preflight.Role(role), preflight.Options{Root: p.opts.Root,
		ProcRoot: p.opts.Facts.ProcRoot, SysRoot: p.opts.Facts.SysRoot, Facts: p.facts,
		EtcdDataDir: etcdDir, Skip: []string{"cri-socket"}, Ignore: ignore})
	if err != nil {
		return false, err
	}
	p.pre = &rep
	for _, r := range rep.Results {
		if r.Status == preflight.Fail && r.Severity == preflight.Warning {
			p.opts.Log.Warn("preflight", "check", r.Name, "message", r.Message)
		}
	}
	return false, rep.Err()
}

// render writes the role's templates (kubelet, runtime, static pods) with the facts and the
// node config.
func (p *plan) render(context.Context) (bool, error) {
	src := filepath.Join(p.opts.Root, nodeimage.TemplatesPath)
	if _, err := os.Stat(src); errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	d := renderData(p.node, p.facts)
	d.Node.Runtime.Socket = p.runtime.Socket
	if ep := p.etcdPlan; ep != nil {
		d.Node.Etcd.ClusterState = ep.State
		d.Node.Etcd.Members = nil
		for _, m := range ep.Members {
			d.Node.Etcd.Members = append(d.Node.Etcd.Members, render.Member(m))
		}
	}
	d.Nameservers = kube.Nameservers(p.opts.Root)
	changed, err := render.Render(src, p.opts.Root, d)
	if err != nil && p.facts.IPv4 == "" && p.facts.IPv6 == "" {
		// Templates of a role that does not need an address may still use it (.NodeIP).
		err = task.Unknown(factAddress, err)
	}
	return len(changed) > 0, err
}

// renderData maps the node config onto what the templates use.
func renderData(n *config.Node, f *facts.Facts) render.Data {
	d := render.Data{Role: string(n.Role), Facts: *f}
	d.Node.ClusterName = n.Cluster.Name
	k := n.Kubernetes
	d.Node.Kubernetes.Version = k.Version
	d.Node.Kubernetes.PodCIDR = k.PodCIDR
	d.Node.Kubernetes.ServiceCIDR = k.ServiceCIDR
	if k.ClusterDNS != "" {
		d.Node.Kubernetes.ClusterDNS = []string{k.ClusterDNS}
	}
	d.Node.Kubernetes.ClusterDomain = k.ClusterDomain
	d.Node.Kubernetes.NodeLabels = k.NodeLabels
	d.Node.Kubernetes.LeaderElection = render.LeaderElection(k.LeaderElection)
	if n.APIEndpoint != "" {
		d.Node.Kubernetes.APIServer = pki.ServerURL(n.APIEndpoint)
	}
	if n.Etcd != nil && n.Etcd.External {
		// The API server uses the etcd nodes' members, by their DNS names.
		d.Node.Etcd.External = true
		for _, m := range etcdmember.StaticCluster(n) {
			if u, err := etcdmember.ClientURL(m.PeerURL); err == nil {
				d.Node.Etcd.Servers = append(d.Node.Etcd.Servers, u)
			}
		}
	} else if n.Etcd != nil {
		d.Node.Etcd.Name = n.Etcd.Member
		d.Node.Etcd.HeartbeatMS, d.Node.Etcd.ElectionMS = n.Etcd.EtcdTimings()
		if n.Etcd.Volume != nil {
			d.Node.Etcd.DataDir = n.Etcd.Volume.MountPath
		}
		if n.Cluster.DNSZone != "" && len(n.Etcd.Members) > 1 {
			// Several members find each other by their DNS names (kiln-dns registers them).
			for _, m := range etcdmember.StaticCluster(n) {
				d.Node.Etcd.Members = append(d.Node.Etcd.Members, render.Member(m))
				if m.Name == n.Etcd.Member {
					d.Node.Etcd.PeerURL = m.PeerURL
				}
			}
		}
	}
	return d
}

// fileStatus describes the config's files as they are now on the node.
func (p *plan) fileStatus() []FileStatus {
	out := []FileStatus{}
	for _, f := range p.files {
		if fst, err := hashFile(p.opts.Root, f.Path); err == nil {
			out = append(out, fst)
		}
	}
	return out
}
