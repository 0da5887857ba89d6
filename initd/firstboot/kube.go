package firstboot

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/kilnproject/kiln/initd/config"
	"github.com/kilnproject/kiln/initd/kube"
	"github.com/kilnproject/kiln/initd/pki"
	"github.com/kilnproject/kiln/initd/systemd"
	"github.com/kilnproject/kiln/initd/task"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

// Units of the kubernetes overlay that first boot enables (and starts in this boot).
const (
	KubeletUnit      = "kubelet.service"
	CNIUnit          = "kiln-cni.service"
	ControlPlaneUnit = "kiln-control-plane.service"
	// EtcdMemberUnit promotes a member that joined as a learner and reports the member's
	// state (etcd members of several).
	EtcdMemberUnit = "kiln-etcd-member.service"
	// EtcdUnit runs an etcd node's member (overlays/etcd): etcd under systemd.
	EtcdUnit = "etcd.service"
)

// pkiTasks make a control plane's certificates and kubeconfigs once preflight passed.
func (p *plan) pkiTasks() []task.Task {
	return []task.Task{task.Converge("pki", []string{"preflight"}, p.writePKI)}
}

// kubeletTasks hand over to kubelet once its configuration (render), credentials (pki) and,
// on an etcd member, etcd's manifest are in place.
func (p *plan) kubeletTasks() []task.Task {
	return []task.Task{
		task.Converge("containerd-store", []string{"storage"}, p.seedStore),
		task.Converge("kubelet", []string{"render", "pki", "etcd-manifest", "containerd-store"}, p.handOver),
	}
}

// seedStore copies containerd's store laid at bake into containerd's root before containerd
// first starts (kube.SeedStore): the pre-pulled images are then ready, nothing to import.
func (p *plan) seedStore(context.Context) (bool, error) {
	seeded, err := kube.SeedStore(p.opts.Root)
	if seeded {
		p.opts.Log.Info("containerd store laid from the image", "root", nodeimage.StoreRoot)
	}
	return seeded, err
}

// writePKI is kubeadm's certs and kubeconfig phases: on a control plane, the leaf
// certificates from the CAs the config delivered, and the kubeconfigs of admin,
// super-admin, kubelet, controller-manager and scheduler pointing at this node's API
// server; on an etcd node, its member's certificates from the etcd CA. Valid existing files
// are kept (a re-run changes nothing). An image without the kubernetes overlay (no
// kubelet.service) runs neither: nothing to do.
func (p *plan) writePKI(context.Context) (bool, error) {
	if p.node.Role != config.RoleControlPlane && p.node.Role != config.RoleEtcd {
		return false, nil
	}
	if runs, err := p.runsUnitOf(p.node.Role); !runs || err != nil {
		return false, err
	}
	dir := filepath.Join(p.opts.Root, nodeimage.KubePKIDir)
	ca, missing, forWhat := "ca.crt", "no cluster CA at %s/%s: a control plane gets its CAs from its Ignition config (kiln cluster init writes them)", "the API server"
	if p.node.Role == config.RoleEtcd {
		ca, missing, forWhat = pki.EtcdCAName+".crt", "no etcd CA at %s/%s: an etcd node gets it from its Ignition config (kiln cluster init writes it)", "its etcd certificates"
	}
	if _, err := os.Stat(filepath.Join(dir, ca)); errors.Is(err, fs.ErrNotExist) {
		return false, fmt.Errorf(missing, nodeimage.KubePKIDir, ca)
	}
	n := p.pkiNode()
	nodeIP := p.facts.IPv4
	if nodeIP == "" {
		nodeIP = p.facts.IPv6
	}
	if nodeIP == "" {
		return false, task.Unknown(factAddress, errors.New("the node has no IP address for "+forWhat))
	}
	if p.node.Role == config.RoleEtcd {
		certs, err := pki.EtcdCerts(dir, n, p.opts.Now())
		if len(certs) > 0 {
			p.opts.Log.Info("etcd PKI written", "certificates", certs)
		}
		return len(certs) > 0, err
	}
	certs, err := pki.ControlPlaneCerts(dir, n, p.opts.Now())
	if err != nil {
		return len(certs) > 0, err
	}
	server := "https://" + net.JoinHostPort(nodeIP, fmt.Sprint(config.DefaultAPIPort))
	confs, err := pki.ControlPlaneKubeconfigs(filepath.Join(p.opts.Root, nodeimage.KubeDir), dir, n, server, p.opts.Now())
	if len(certs)+len(confs) > 0 {
		p.opts.Log.Info("control-plane PKI written", "certificates", certs, "kubeconfigs", confs)
	}
	return len(certs)+len(confs) > 0, err
}

// runsUnitOf reports whether the image runs what a node of role needs first boot to set up:
// kubelet (the kubernetes overlay) or, for an etcd node, etcd.service or a kubelet that runs
// etcd as a static pod. An image without them is a plain node of that role.
func (p *plan) runsUnitOf(role config.Role) (bool, error) {
	units := []string{KubeletUnit}
	if role == config.RoleEtcd {
		units = []string{EtcdUnit, KubeletUnit}
	}
	for _, u := range units {
		_, err := systemd.Find(p.opts.Root, u)
		if err == nil {
			return true, nil
		}
		if !errors.Is(err, systemd.ErrNotFound) {
			return false, err
		}
	}
	return false, nil
}

// pkiNode is what the control plane's certificates are made for.
func (p *plan) pkiNode() pki.Node {
	n := pki.Node{Hostname: p.facts.Hostname, ServiceCIDR: p.node.Kubernetes.ServiceCIDR,
		ClusterDomain: p.node.Kubernetes.ClusterDomain, ExternalEtcd: p.node.Etcd != nil && p.node.Etcd.External}
	for _, s := range []string{p.facts.IPv4, p.facts.IPv6} {
		if ip := net.ParseIP(s); ip != nil {
			n.IPs = append(n.IPs, ip)
		}
	}
	if host, _, err := net.SplitHostPort(strings.TrimPrefix(p.node.APIEndpoint, "https://")); err == nil {
		n.APIServerSANs = append(n.APIServerSANs, host)
	}
	if p.node.Cluster.DNSZone != "" {
		n.APIServerSANs = append(n.APIServerSANs, p.node.InternalName("api"))
		if p.etcdMember() && p.node.Etcd.Member != "" {
			n.EtcdSANs = append(n.EtcdSANs, p.node.InternalName("etcd-"+p.node.Etcd.Member))
		}
	}
	return n
}

// handOver hands over to the units that run the node once their configuration and
// credentials are in place: it enables kubelet (and, by role, kiln-cni and
// kiln-control-plane), or on an etcd node etcd.service, and on an etcd member of several
// kiln-etcd-member, for every later boot and, on the live system, reloads systemd (the
// drop-ins were just rendered) and queues their start; systemd starts them after first
// boot (kubelet after containerd and the image import). An image without them (no
// kubernetes or etcd overlay) is a plain node: nothing to do.
func (p *plan) handOver(ctx context.Context) (bool, error) {
	root := p.opts.Root
	if runs, err := p.runsUnitOf(p.node.Role); !runs || err != nil {
		return false, err
	}
	units := []string{KubeletUnit}
	switch p.node.Role {
	case config.RoleControlPlane:
		if !exists(root, nodeimage.KubeletConfPath) {
			return false, fmt.Errorf("kubelet has no credentials: %s is missing", nodeimage.KubeletConfPath)
		}
		units = append(units, CNIUnit, ControlPlaneUnit)
	case config.RoleWorker:
		if !exists(root, nodeimage.BootstrapKubeletConfPath) && !exists(root, nodeimage.KubeletConfPath) {
			return false, fmt.Errorf("kubelet has no credentials: neither %s nor %s exists (kiln cluster init puts the bootstrap kubeconfig in a worker's Ignition config)", nodeimage.BootstrapKubeletConfPath, nodeimage.KubeletConfPath)
		}
		units = append(units, CNIUnit)
	case config.RoleEtcd:
		if _, err := systemd.Find(root, EtcdUnit); err == nil {
			units = []string{EtcdUnit}
		}
	}
	if p.etcdMember() && len(p.node.Etcd.Members) > 1 {
		units = append(units, EtcdMemberUnit)
	}
	changed := false
	if slices.Contains(units, KubeletUnit) {
		var err error
		if changed, err = kube.EnsureResolvConf(root); err != nil {
			return false, err
		}
	}
	for _, u := range units {
		c, err := systemd.Enable(root, u)
		if err != nil {
			return false, fmt.Errorf("enable %s: %w", u, err)
		}
		changed = changed || c
	}
	if root == "/" {
		if err := p.opts.Systemctl(ctx, "daemon-reload"); err != nil {
			return false, err
		}
		// --no-block: they are ordered after kiln-firstboot, which is still running.
		if err := p.opts.Systemctl(ctx, append([]string{"start", "--no-block", "--"}, units...)...); err != nil {
			return false, err
		}
	}
	return changed, nil
}

func exists(root, p string) bool {
	_, err := os.Stat(filepath.Join(root, p))
	return err == nil
}
