package qemucluster

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"github.com/kilnproject/kiln/builder/cluster"
)

// Subnet is the private link's network; the host has no address on it.
const (
	subnetPrefix = "192.168.100."
	subnetBits   = 24
	// MaxWorkers is how many workers fit the plan's addresses (192.168.100.101…250).
	MaxWorkers = 150
	// EtcdDiskSerial is the serial of each etcd member's disk (a stacked control plane's,
	// an etcd node's).
	EtcdDiskSerial = cluster.DefaultEtcdDiskSerial
	// DefaultZone is the DNS zone of the cluster's names.
	DefaultZone = "kiln.test"
)

// Role names.
const (
	RoleControlPlane = "control-plane"
	RoleWorker       = "worker"
	RoleEtcd         = "etcd"
)

// Size is a role's VM size.
type Size struct {
	CPUs     int `json:"cpus"`
	MemoryMB int `json:"memoryMB"`
}

// Options is what `kiln cluster up` is asked for.
type Options struct {
	Name          string
	Zone          string
	ControlPlanes int
	Workers       int
	// EtcdNodes is the number of etcd nodes (the external topology); 0 stacks a member on
	// each control plane.
	EtcdNodes int
	ImageDir  string // holds <Image>-control-plane.{qcow2,raw}, <Image>-worker and <Image>-etcd

	Image        string // image stem, default "qemu"
	StateDir     string // default DefaultStateDir(Name)
	Accel        string // kvm or tcg (resolved)
	ControlPlane Size
	Worker       Size
	Etcd         Size
	EtcdDiskSize string // qemu-img size, default 2G
	APIPort      int    // first host port of the API forwards; 0 picks free ones
	SlowCP       bool   // cluster init --slow-control-plane
	// WorkerNice lowers the workers' host CPU priority (see vm.Config.Nice).
	WorkerNice int
	// SSHKeys are public keys (authorized_keys lines) root accepts on every node, whose ssh
	// server is then enabled and forwarded to a port on 127.0.0.1; none: no ssh.
	SSHKeys []string
}

// Node is one VM of the plan.
type Node struct {
	Name string `json:"name"`
	Role string `json:"role"`
	// EtcdMember is the etcd member the node runs (a stacked control plane, an etcd node);
	// such a node has an etcd disk.
	EtcdMember string `json:"etcdMember,omitempty"`
	Address    string `json:"address"`
	MAC        string `json:"mac"`
	Size       Size   `json:"size"`
	// APIPort is the host port forwarded to a control plane's 6443 (0 on workers).
	APIPort int `json:"apiPort,omitempty"`
	// EtcdPort is the host port forwarded to an etcd member's client port, 2379 (etcd
	// listens on the node's link address: the forward goes there).
	EtcdPort int `json:"etcdPort,omitempty"`
	// SSHPort is the host port forwarded to the node's ssh server (with up --ssh-key).
	SSHPort int `json:"sshPort,omitempty"`
	Nice    int `json:"nice,omitempty"`
}

// State is a cluster's cluster.json.
type State struct {
	Name   string `json:"name"`
	Zone   string `json:"zone"`
	Accel  string `json:"accel"`
	Link   string `json:"link"`
	Images struct {
		ControlPlane string `json:"controlPlane"`
		Worker       string `json:"worker,omitempty"`
		Etcd         string `json:"etcd,omitempty"`
	} `json:"images"`
	EtcdDiskSize string `json:"etcdDiskSize"`
	// SSHKeys are the public keys root accepts on every node (up --ssh-key).
	SSHKeys []string `json:"sshKeys,omitempty"`
	Nodes   []Node   `json:"nodes"`
	// Dir is the state directory (not stored).
	Dir string `json:"-"`
}

var nameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]*[a-z0-9])?$`)

// DefaultStateDir is where a cluster named name keeps its state without --state-dir.
func DefaultStateDir(name string) string {
	base := os.Getenv("XDG_STATE_HOME")
	if base == "" {
		home, err := os.UserHomeDir()
		if err != nil || home == "" {
			home = os.TempDir()
		}
		base = filepath.Join(home, ".local", "state")
	}
	return filepath.Join(base, "kiln", "clusters", name)
}

// withDefaults fills o's defaults and checks it, naming flags.
func (o Options) withDefaults() (Options, error) {
	var errs []error
	if !nameRE.MatchString(o.Name) || len(o.Name) > 40 {
		errs = append(errs, fmt.Errorf("--name %q: want an RFC 1123 label of at most 40 characters", o.Name))
	}
	if o.Zone == "" {
		o.Zone = DefaultZone
	}
	if o.ControlPlanes != 1 && o.ControlPlanes != 3 {
		errs = append(errs, fmt.Errorf("--control-planes %d: a cluster has 1 or 3 (etcd needs a majority)", o.ControlPlanes))
	}
	switch o.EtcdNodes {
	case 0, 1, 3, cluster.MaxEtcdNodes:
	default:
		errs = append(errs, fmt.Errorf("--etcd-nodes %d: 0 (a member on each control plane), 1, 3 or 5 (etcd needs a majority)", o.EtcdNodes))
	}
	if o.Workers < 0 || o.Workers > MaxWorkers {
		errs = append(errs, fmt.Errorf("--workers %d: want 0 to %d", o.Workers, MaxWorkers))
	}
	if o.Image == "" {
		o.Image = "qemu"
	}
	if o.StateDir == "" && o.Name != "" {
		o.StateDir = DefaultStateDir(o.Name)
	}
	if o.EtcdDiskSize == "" {
		o.EtcdDiskSize = "2G"
	}
	for _, s := range []struct {
		flag string
		sz   *Size
		cpus int
		mem  int
	}{{"cp", &o.ControlPlane, 2, 3072}, {"worker", &o.Worker, 1, 2048}, {"etcd", &o.Etcd, 1, 1024}} {
		if s.sz.CPUs == 0 {
			s.sz.CPUs = s.cpus
		}
		if s.sz.MemoryMB == 0 {
			s.sz.MemoryMB = s.mem
		}
		if s.sz.CPUs < 1 || s.sz.CPUs > 64 {
			errs = append(errs, fmt.Errorf("--%s-cpus %d: want 1 to 64", s.flag, s.sz.CPUs))
		}
		if s.sz.MemoryMB < 1024 {
			errs = append(errs, fmt.Errorf("--%s-memory %d: a node needs at least 1024 MiB", s.flag, s.sz.MemoryMB))
		}
	}
	if o.APIPort < 0 || o.APIPort+o.ControlPlanes-1 > 65535 {
		errs = append(errs, fmt.Errorf("--api-port %d: out of range", o.APIPort))
	}
	return o, errors.Join(errs...)
}

// plan lays out the nodes: names and members as cluster init makes them (etcd nodes,
// control planes, workers), fixed addresses and MACs, the control planes' API ports and the
// etcd members' client ports on the host (ports, etcdPorts, in node order).
func plan(o Options, ports, etcdPorts []int) []Node {
	var nodes []Node
	members := []string{"a", "b", "c", "d", "e"}
	for i := 1; i <= o.EtcdNodes; i++ {
		addr := fmt.Sprintf("%s%d", subnetPrefix, 20+i)
		nodes = append(nodes, Node{Name: fmt.Sprintf("%s-etcd-%d", o.Name, i), Role: RoleEtcd,
			EtcdMember: members[i-1], Address: addr, MAC: nodeMAC(o.Name, addr), Size: o.Etcd})
	}
	for i := 1; i <= o.ControlPlanes; i++ {
		addr := fmt.Sprintf("%s%d", subnetPrefix, 10+i)
		n := Node{Name: fmt.Sprintf("%s-cp-%d", o.Name, i), Role: RoleControlPlane,
			Address: addr, MAC: nodeMAC(o.Name, addr), Size: o.ControlPlane, APIPort: ports[i-1]}
		if o.EtcdNodes == 0 {
			n.EtcdMember = members[i-1]
		}
		nodes = append(nodes, n)
	}
	m := 0
	for i := range nodes {
		if nodes[i].EtcdMember != "" && m < len(etcdPorts) {
			nodes[i].EtcdPort = etcdPorts[m]
			m++
		}
	}
	for i := 1; i <= o.Workers; i++ {
		addr := fmt.Sprintf("%s%d", subnetPrefix, 100+i)
		nodes = append(nodes, Node{Name: fmt.Sprintf("%s-worker-%d", o.Name, i), Role: RoleWorker,
			Address: addr, MAC: nodeMAC(o.Name, addr), Size: o.Worker, Nice: o.WorkerNice})
	}
	return nodes
}

// members is how many etcd members o makes: its etcd nodes, else its control planes.
func (o Options) members() int {
	if o.EtcdNodes > 0 {
		return o.EtcdNodes
	}
	return o.ControlPlanes
}

// nodeMAC is a locally administered unicast MAC: two bytes of the cluster name's hash (two
// clusters' frames never share a link anyway) and the address's last two octets.
func nodeMAC(cluster, addr string) string {
	h := sha256.Sum256([]byte("kiln-cluster\x00" + cluster))
	ip := net.ParseIP(addr).To4()
	return net.HardwareAddr{0x02, 0x6b, h[0], h[1], ip[2], ip[3]}.String()
}

// linkName is the private link of cluster name (its multicast group follows from it).
func linkName(name string) string { return "kiln-cluster-" + name }

// Names are the cluster's names as every node's /etc/hosts has them: name → addresses.
func (s *State) Names() map[string][]string {
	names := map[string][]string{}
	internal := ".internal." + s.Name + "." + s.Zone
	for _, n := range s.Nodes {
		names[n.Name] = append(names[n.Name], n.Address)
		names[n.Name+internal] = append(names[n.Name+internal], n.Address)
		if n.Role == RoleControlPlane {
			names["api"+internal] = append(names["api"+internal], n.Address)
		}
		if n.EtcdMember != "" {
			etcd := "etcd-" + n.EtcdMember + internal
			names[etcd] = append(names[etcd], n.Address)
		}
	}
	return names
}

// HostsFile is /etc/hosts as seeded into every node: localhost, then one line per
// address and name, sorted by name.
func (s *State) HostsFile() string {
	var b strings.Builder
	b.WriteString("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n# the cluster's names (kiln cluster up)\n")
	names := s.Names()
	keys := make([]string, 0, len(names))
	for k := range names {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		for _, a := range names[k] {
			fmt.Fprintf(&b, "%s\t%s\n", a, k)
		}
	}
	return b.String()
}

// Node returns the node called name, or an error listing the cluster's nodes.
func (s *State) Node(name string) (*Node, error) {
	var all []string
	for i := range s.Nodes {
		if s.Nodes[i].Name == name {
			return &s.Nodes[i], nil
		}
		all = append(all, s.Nodes[i].Name)
	}
	return nil, fmt.Errorf("cluster %s has no node %q (nodes: %s)", s.Name, name, strings.Join(all, ", "))
}

// APIEndpoint is the name every node reaches the API through.
func (s *State) APIEndpoint() string { return "api.internal." + s.Name + "." + s.Zone + ":6443" }

// Paths in the state directory.
func (s *State) file(name string) string        { return filepath.Join(s.Dir, name) }
func (s *State) nodeDir(n string) string        { return filepath.Join(s.Dir, "nodes", n) }
func (s *State) nodeFile(n, name string) string { return filepath.Join(s.nodeDir(n), name) }
func (s *State) Kubeconfig() string             { return s.file(adminFile) }
func (s *State) ConsoleLog(node string) string  { return s.nodeFile(node, consoleFile) }
func (s *State) EtcdDisk(node string) string    { return s.nodeFile(node, etcdDiskFile) }
func (s *State) initDir() string                { return s.file(initDirName) }
func (s *State) pidFile(node string) string     { return s.nodeFile(node, pidFileName) }

// File names in the state directory.
const (
	stateFile    = "cluster.json"
	adminFile    = "admin.conf"
	initDirName  = "init"
	diskFile     = "disk.qcow2"
	etcdDiskFile = "etcd.qcow2"
	configFile   = "config.ign"
	consoleFile  = "console.log"
	qemuLogFile  = "qemu.log"
	pidFileName  = "qemu.pid"
)
