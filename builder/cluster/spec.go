package cluster

import (
	"errors"
	"fmt"
	"net"
	"regexp"
	"strconv"
	"strings"

	"github.com/kilnproject/kiln/initd/config"
)

// Defaults of a Spec.
const (
	DefaultKubernetesVersion = "v1.37.2"
	DefaultEtcdDiskSerial    = "etcd-main"
	DefaultWorkers           = 1
)

// Spec is what `kiln cluster init` is asked for; cluster.yaml records it.
type Spec struct {
	Name          string `yaml:"name"`
	DNSZone       string `yaml:"dnsZone"`
	ControlPlanes int    `yaml:"controlPlanes"`
	Workers       int    `yaml:"workers"`
	// EtcdNodes is the number of dedicated etcd nodes (the external topology: the control
	// planes run no etcd member and use these); 0 stacks a member on each control plane.
	EtcdNodes int `yaml:"etcdNodes,omitempty"`
	// APIEndpoint is host:port; default api.internal.<name>.<dnsZone>:6443.
	APIEndpoint string `yaml:"apiEndpoint"`
	// EtcdDiskSerial selects each etcd member's disk (a stacked control plane's, an etcd
	// node's) by serial
	// (/dev/disk/by-id/*-<serial>); empty keeps etcd's data on /var.
	EtcdDiskSerial    string `yaml:"etcdDiskSerial,omitempty"`
	KubernetesVersion string `yaml:"kubernetesVersion"`
	PodCIDR           string `yaml:"podCIDR"`
	ServiceCIDR       string `yaml:"serviceCIDR"`
	// AdminServer is the server URL written to admin.conf; default https://<apiEndpoint>.
	AdminServer string `yaml:"adminServer"`
	// AdminTLSServerName is admin.conf's tls-server-name (for a forwarded port whose
	// host is not in the API server's certificate).
	AdminTLSServerName string `yaml:"adminTLSServerName,omitempty"`
	// SlowControlPlane gives the control planes' controller-manager and scheduler
	// slowLeaderElection and their etcd members slowEtcdHeartbeat and slowEtcdElection: for
	// emulated or shared CPUs, where the API server can stall longer than the default 10 s
	// renew deadline (a leader that misses it exits) and an etcd member longer than etcd's
	// 1 s election timeout (its peers elect another leader).
	SlowControlPlane bool `yaml:"slowControlPlane,omitempty"`
	// ControlPlanePreflightIgnore names preflight checks whose failure does not stop a
	// control plane's first boot (node.yaml preflight.ignore), e.g. cpus for control planes
	// given one vCPU.
	ControlPlanePreflightIgnore []string `yaml:"controlPlanePreflightIgnore,omitempty"`
}

// slowLeaderElection are the lease timings of a SlowControlPlane: a lease request may take
// 20 s (half the renew deadline) instead of 5 s; failover takes up to a minute.
var slowLeaderElection = config.LeaderElection{LeaseDuration: "60s", RenewDeadline: "40s", RetryPeriod: "5s"}

// slowEtcdHeartbeat and slowEtcdElection are the Raft timings of a SlowControlPlane's etcd
// members: a member that stalls for up to 5 s keeps its leader (etcd's own: 100ms, 1s).
const (
	slowEtcdHeartbeat = "500ms"
	slowEtcdElection  = "5s"
)

// Role names in the node list.
const (
	roleControlPlane = string(config.RoleControlPlane)
	roleWorker       = string(config.RoleWorker)
	roleEtcd         = string(config.RoleEtcd)
)

// Node is one machine of the cluster.
type Node struct {
	Name       string `yaml:"name"`
	Role       string `yaml:"role"`
	EtcdMember string `yaml:"etcdMember,omitempty"`
	Ignition   string `yaml:"ignition"` // file name in the output directory
}

// etcdMembers are the member names, in the order nodes take them: control plane i (stacked)
// or etcd node i is member etcdMembers[i-1].
var etcdMembers = []string{"a", "b", "c", "d", "e"}

// MaxEtcdNodes is the most etcd nodes a cluster has.
const MaxEtcdNodes = 5

var label = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]*[a-z0-9])?$`)

// EtcdMembers are the cluster's etcd member names: the etcd nodes', else the control planes'.
func (s Spec) EtcdMembers() []string {
	if s.EtcdNodes > 0 {
		return etcdMembers[:min(s.EtcdNodes, len(etcdMembers))]
	}
	return etcdMembers[:min(s.ControlPlanes, 3)]
}

// withDefaults returns s with defaults filled in, or the first problem, naming the flag.
func (s Spec) withDefaults() (Spec, error) {
	s.DNSZone = strings.TrimSuffix(s.DNSZone, ".")
	var errs []error
	bad := func(flag, format string, args ...any) {
		errs = append(errs, fmt.Errorf("--%s: %s", flag, fmt.Sprintf(format, args...)))
	}
	// The longest node name, <name>-worker-<W>, must still be a DNS label.
	longest := fmt.Sprintf("%s-worker-%d", s.Name, max(s.Workers, 1))
	switch {
	case s.Name == "":
		bad("name", "is required")
	case !label.MatchString(s.Name):
		bad("name", "%q is not an RFC 1123 label (lower-case letters, digits and '-')", s.Name)
	case len(longest) > 63:
		bad("name", "%q is too long: node name %s is longer than 63 characters", s.Name, longest)
	}
	if s.DNSZone == "" {
		bad("dns-zone", "is required (the cluster's names are <host>.internal.<name>.<zone>)")
	}
	if s.ControlPlanes != 1 && s.ControlPlanes != 3 {
		bad("control-planes", "%d: a cluster has 1 or 3 control planes (etcd needs a majority)", s.ControlPlanes)
	}
	switch s.EtcdNodes {
	case 0, 1, 3, MaxEtcdNodes:
	default:
		bad("etcd-nodes", "%d: a cluster has 0 (a member on each control plane), 1, 3 or 5 etcd nodes (etcd needs a majority)", s.EtcdNodes)
	}
	if s.Workers < 0 || s.Workers > 1000 {
		bad("workers", "%d is not between 0 and 1000", s.Workers)
	}
	if s.KubernetesVersion == "" {
		s.KubernetesVersion = DefaultKubernetesVersion
	}
	if s.PodCIDR == "" {
		s.PodCIDR = config.DefaultPodCIDR
	}
	if s.ServiceCIDR == "" {
		s.ServiceCIDR = config.DefaultServiceCIDR
	}
	if s.APIEndpoint == "" && s.Name != "" && s.DNSZone != "" {
		s.APIEndpoint = net.JoinHostPort("api.internal."+s.Name+"."+s.DNSZone, strconv.Itoa(config.DefaultAPIPort))
	}
	s.APIEndpoint = strings.TrimPrefix(s.APIEndpoint, "https://")
	if s.APIEndpoint != "" {
		if _, _, err := net.SplitHostPort(s.APIEndpoint); err != nil {
			bad("api-endpoint", "%q is not host:port (e.g. 192.168.100.11:6443)", s.APIEndpoint)
		}
	}
	if strings.ContainsAny(s.EtcdDiskSerial, "/ \t\n") {
		bad("etcd-disk-serial", "%q must not contain '/' or spaces", s.EtcdDiskSerial)
	}
	if s.AdminServer == "" && s.APIEndpoint != "" {
		s.AdminServer = "https://" + s.APIEndpoint
	}
	if s.AdminServer != "" && !strings.HasPrefix(s.AdminServer, "https://") {
		bad("admin-server", "%q is not an https:// URL", s.AdminServer)
	}
	return s, errors.Join(errs...)
}

// nodes lists the cluster's machines: etcd nodes first, then control planes, then workers.
func (s Spec) nodes() []Node {
	var nodes []Node
	for i := 1; i <= s.EtcdNodes && i <= len(etcdMembers); i++ {
		name := fmt.Sprintf("%s-etcd-%d", s.Name, i)
		nodes = append(nodes, Node{Name: name, Role: roleEtcd, EtcdMember: etcdMembers[i-1], Ignition: name + ".ign"})
	}
	for i := 1; i <= s.ControlPlanes && i <= 3; i++ {
		name := fmt.Sprintf("%s-cp-%d", s.Name, i)
		n := Node{Name: name, Role: roleControlPlane, Ignition: name + ".ign"}
		if s.EtcdNodes == 0 {
			n.EtcdMember = etcdMembers[i-1]
		}
		nodes = append(nodes, n)
	}
	for i := 1; i <= s.Workers; i++ {
		name := fmt.Sprintf("%s-worker-%d", s.Name, i)
		nodes = append(nodes, Node{Name: name, Role: roleWorker, Ignition: name + ".ign"})
	}
	return nodes
}

// flagOf maps node.yaml fields to the flags that set them.
var flagOf = map[string]string{
	"cluster.name":           "name",
	"cluster.dnsZone":        "dns-zone",
	"dns.zone":               "dns-zone",
	"hostname":               "name",
	"apiEndpoint":            "api-endpoint",
	"etcd.volume.serial":     "etcd-disk-serial",
	"kubernetes.version":     "kubernetes-version",
	"kubernetes.podCIDR":     "pod-cidr",
	"kubernetes.serviceCIDR": "service-cidr",
}

// checkNodeConfigs validates the node configs s leads to the way the nodes will, and
// reports each problem once, naming the flag.
func (s Spec) checkNodeConfigs() error {
	c := &Cluster{Spec: s}
	var errs []error
	seen := map[string]bool{}
	for _, n := range s.nodes() {
		_, err := marshalNodeConfig(c.nodeConfig(n))
		if err == nil {
			continue
		}
		list := []error{err}
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			list = j.Unwrap()
		}
		for _, e := range list {
			msg := e.Error()
			var ne *config.NodeError
			if errors.As(e, &ne) {
				if f, ok := flagOf[ne.Field]; ok {
					msg = fmt.Sprintf("--%s: %v", f, ne.Err)
				} else {
					msg = fmt.Sprintf("node config of %s: %v", n.Name, e)
				}
			}
			if !seen[msg] {
				seen[msg] = true
				errs = append(errs, errors.New(msg))
			}
		}
	}
	return errors.Join(errs...)
}
