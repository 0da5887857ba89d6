package render

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/kilnproject/kiln/initd/firstboot/facts"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

// Data is what templates see: {{.Role}}, {{.Facts.IPv4}}, {{.Node.Kubernetes.Version}}…
// Render fills unset fields with the defaults documented on each field (withDefaults).
type Data struct {
	// Role is "control-plane", "worker" or "etcd".
	Role string
	// Facts are the machine's facts.
	Facts facts.Facts
	// Node is the kiln node config, reduced to what templates use.
	Node Node
	// Nameservers are the node's upstream name servers (its resolv.conf, else its DHCP
	// leases), loopback ones left out. Empty: none known — an offline node; CoreDNS then
	// answers the cluster's names only (its forward plugin refuses to start without one).
	Nameservers []string
}

// Node is the part of /etc/kiln/node.yaml the templates read.
type Node struct {
	// ClusterName names the cluster; default "kubernetes" (kubeadm's).
	ClusterName string
	Kubernetes  Kubernetes
	Etcd        Etcd
	Runtime     Runtime
}

// Kubernetes settings.
type Kubernetes struct {
	// Version is the control-plane image tag; default DefaultKubernetesVersion.
	Version string
	// ImageRepository holds the control-plane and etcd images; default "registry.k8s.io".
	ImageRepository string
	// APIServerPort is kube-apiserver's secure port; default 6443.
	APIServerPort int
	// APIServer is the URL nodes reach the API at, https://host:port (node.yaml's
	// apiEndpoint): kube-proxy's server. Default https://<NodeIP>:<APIServerPort>.
	APIServer string
	// ServiceCIDR is the service IP range; default "10.96.0.0/12".
	ServiceCIDR string
	// PodCIDR is the cluster's pod range, split into node ranges by the controller
	// manager; default "10.244.0.0/16".
	PodCIDR string
	// ClusterDNS are the DNS service IPs given to pods; default ["10.96.0.10"].
	ClusterDNS []string
	// ClusterDomain is the cluster's DNS domain; default "cluster.local".
	ClusterDomain string
	// ServerTLSBootstrap makes kubelet request its serving certificate from the cluster
	// (someone must approve the CSRs); default false (a self-signed one).
	ServerTLSBootstrap bool
	// NodeLabels are extra labels kubelet registers the node with (names kubelet may
	// set itself: not under kubernetes.io/ except the allowed ones).
	NodeLabels map[string]string
	// FeatureGates are passed to kubelet and the control-plane components.
	FeatureGates map[string]bool
	// LeaderElection are kube-controller-manager's and kube-scheduler's lease timings
	// (--leader-elect-lease-duration, -renew-deadline, -retry-period); empty fields keep the
	// components' defaults (15s, 10s, 2s).
	LeaderElection LeaderElection
}

// LeaderElection holds lease timings as Go durations ("15s").
type LeaderElection struct {
	LeaseDuration string
	RenewDeadline string
	RetryPeriod   string
}

// Etcd settings (control-plane and etcd roles).
type Etcd struct {
	// Version is the etcd image tag; default defaultEtcdVersion.
	Version string
	// Name is this member's name; default Facts.Hostname.
	Name string
	// DataDir is etcd's data directory; default "/var/lib/etcd".
	DataDir string
	// Members is the initial cluster; default this node alone (Name at
	// https://<Facts.IPv4>:2380).
	Members []Member
	// PeerURL is this member's advertised peer URL (--initial-advertise-peer-urls); default
	// https://<Facts.IPv4>:2380. In a cluster of several members it is its DNS name,
	// https://etcd-<member>.internal.<cluster>.<zone>:2380, as in Members.
	PeerURL string
	// ClusterState is "new" or "existing" (joining a running cluster); default "new".
	ClusterState string
	// Servers are the client URLs kube-apiserver uses; default
	// ["https://127.0.0.1:2379"] (the local, stacked member).
	Servers []string
	// External says that the members run on etcd nodes (Servers): this control plane runs
	// none, and its templates render no etcd member.
	External bool
	// HeartbeatMS and ElectionMS are --heartbeat-interval and --election-timeout in
	// milliseconds; 0 leaves etcd's own.
	HeartbeatMS, ElectionMS int64
}

// Member is one etcd member of the initial cluster.
type Member struct {
	Name    string
	PeerURL string
}

// Runtime is the container runtime.
type Runtime struct {
	// Socket is the runtime's CRI socket; default "/run/containerd/containerd.sock".
	// Templates write the endpoint as unix://{{.Node.Runtime.Socket}}.
	Socket string
	// SandboxImage is the pod sandbox (pause) image; default defaultSandboxImage.
	SandboxImage string
	// CNIBinDirs hold the CNI plugins; default ["/opt/cni/bin"].
	CNIBinDirs []string
}

// Defaults of the versions kiln builds and tests with.
const (
	DefaultKubernetesVersion = "v1.37.2"
	defaultEtcdVersion       = "3.6.16-0"
	defaultSandboxImage      = "registry.k8s.io/pause:3.10.2"
)

// withDefaults returns a copy of d whose unset fields hold their documented defaults.
// Applying it twice changes nothing.
func (d Data) withDefaults() Data {
	str := func(s *string, v string) {
		if *s == "" {
			*s = v
		}
	}
	list := func(l *[]string, v ...string) {
		if len(*l) == 0 {
			*l = v
		} else {
			*l = slices.Clone(*l)
		}
	}
	n := &d.Node
	str(&n.ClusterName, "kubernetes")

	k := &n.Kubernetes
	str(&k.Version, DefaultKubernetesVersion)
	str(&k.ImageRepository, "registry.k8s.io")
	if k.APIServerPort == 0 {
		k.APIServerPort = 6443
	}
	str(&k.APIServer, "https://"+hostPort(d.NodeIP(), fmt.Sprint(k.APIServerPort)))
	str(&k.ServiceCIDR, "10.96.0.0/12")
	str(&k.PodCIDR, "10.244.0.0/16")
	list(&k.ClusterDNS, "10.96.0.10")
	str(&k.ClusterDomain, "cluster.local")
	k.NodeLabels = maps.Clone(k.NodeLabels)
	k.FeatureGates = maps.Clone(k.FeatureGates)
	if k.NodeLabels == nil {
		k.NodeLabels = map[string]string{}
	}
	if k.FeatureGates == nil {
		k.FeatureGates = map[string]bool{}
	}

	e := &n.Etcd
	str(&e.Version, defaultEtcdVersion)
	str(&e.Name, d.Facts.Hostname)
	str(&e.DataDir, nodeimage.EtcdDataDir)
	str(&e.PeerURL, "https://"+hostPort(d.NodeIP(), "2380"))
	if len(e.Members) == 0 {
		e.Members = []Member{{Name: e.Name, PeerURL: e.PeerURL}}
	} else {
		e.Members = slices.Clone(e.Members)
	}
	str(&e.ClusterState, "new")
	list(&e.Servers, "https://127.0.0.1:2379")

	r := &n.Runtime
	str(&r.Socket, nodeimage.ContainerdSocket)
	str(&r.SandboxImage, defaultSandboxImage)
	list(&r.CNIBinDirs, nodeimage.CNIBinDir)

	d.Facts.MACs = maps.Clone(d.Facts.MACs)
	return d
}

// NodeIP is the address components advertise: Facts.IPv4, else Facts.IPv6, else "".
func (d Data) NodeIP() string {
	if d.Facts.IPv4 != "" {
		return d.Facts.IPv4
	}
	return d.Facts.IPv6
}

// NodeLabels is kubelet's --node-labels value: kiln.dev/role, the topology labels when
// the platform named a zone and region, then Node.Kubernetes.NodeLabels; sorted by name.
func (d Data) NodeLabels() string {
	labels := maps.Clone(d.Node.Kubernetes.NodeLabels)
	if labels == nil {
		labels = map[string]string{}
	}
	labels["kiln.dev/role"] = d.Role
	if d.Facts.Zone != "" {
		labels["topology.kubernetes.io/zone"] = d.Facts.Zone
	}
	if d.Facts.Region != "" {
		labels["topology.kubernetes.io/region"] = d.Facts.Region
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		parts = append(parts, k+"="+labels[k])
	}
	return strings.Join(parts, ",")
}

// FeatureGatesFlag is the --feature-gates value, "A=true,B=false" sorted by name; ""
// when there are none.
func (k Kubernetes) FeatureGatesFlag() string {
	var parts []string
	for _, name := range slices.Sorted(maps.Keys(k.FeatureGates)) {
		parts = append(parts, fmt.Sprintf("%s=%t", name, k.FeatureGates[name]))
	}
	return strings.Join(parts, ",")
}

// InitialCluster is etcd's --initial-cluster value, "name=peerURL,…".
func (e Etcd) InitialCluster() string {
	parts := make([]string, len(e.Members))
	for i, m := range e.Members {
		parts[i] = m.Name + "=" + m.PeerURL
	}
	return strings.Join(parts, ",")
}

func hostPort(host, port string) string {
	if strings.Contains(host, ":") {
		return "[" + host + "]:" + port
	}
	return host + ":" + port
}
