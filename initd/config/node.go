package config

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kilnproject/kiln/internal/nodeimage"
	"github.com/kilnproject/kiln/internal/strictyaml"
)

// Node is the kiln node config, /etc/kiln/node.yaml: what this node is in which
// cluster. LoadNode and ParseNode return it validated and with every default filled in
// (README.md in this directory documents each field and its default).
type Node struct {
	Cluster     Cluster    `yaml:"cluster"`
	Role        Role       `yaml:"role"`
	Hostname    string     `yaml:"hostname"`
	DNS         DNS        `yaml:"dns"`
	Etcd        *Etcd      `yaml:"etcd"`
	APIEndpoint string     `yaml:"apiEndpoint"`
	Kubernetes  Kubernetes `yaml:"kubernetes"`
	Preflight   Preflight  `yaml:"preflight,omitempty"`
	AWS         AWS        `yaml:"aws"`
	GCE         GCE        `yaml:"gce"`
}

// Preflight tunes first boot's preflight checks (kubeadm's). Ignore names checks whose
// failure is reported (kiln-init status, the log) but does not stop the Kubernetes tasks, as
// kubeadm's --ignore-preflight-errors: e.g. cpus for an emulated control plane with one vCPU.
// "all" ignores every check.
type Preflight struct {
	Ignore []string `yaml:"ignore,omitempty"`
}

// Cluster names the cluster. Its DNS names are <host>.internal.<name>.<dnsZone>.
type Cluster struct {
	Name    string `yaml:"name"`
	DNSZone string `yaml:"dnsZone"`
}

// Role is what a node runs.
type Role string

// The roles.
const (
	RoleWorker       Role = "worker"        // kubelet and workloads
	RoleControlPlane Role = "control-plane" // apiserver, controller-manager, scheduler and an etcd member
	RoleEtcd         Role = "etcd"          // a dedicated etcd member
)

// Roles are the roles a node config may name: the roles kiln-init configures Kubernetes
// for. An image baked for a role of another name is a plain node, without Kubernetes.
func Roles() []Role { return []Role{RoleWorker, RoleControlPlane, RoleEtcd} }

// Known reports whether r is one of Roles.
func (r Role) Known() bool { return slices.Contains(Roles(), r) }

// DNSProvider publishes the cluster's DNS records.
type DNSProvider string

// The DNS providers.
const (
	DNSRFC2136  DNSProvider = "rfc2136"  // dynamic updates to an authoritative server, optionally TSIG-signed
	DNSRoute53  DNSProvider = "route53"  // AWS Route 53
	DNSCloudDNS DNSProvider = "clouddns" // Google Cloud DNS
	DNSHosts    DNSProvider = "hosts"    // entries in the node's /etc/hosts
	DNSNone     DNSProvider = "none"     // kiln publishes nothing; the names must resolve otherwise
)

// DNS says how the cluster's names are published.
type DNS struct {
	Provider       DNSProvider `yaml:"provider"`
	Server         string      `yaml:"server"`
	Zone           string      `yaml:"zone"`
	TSIGKeyName    string      `yaml:"tsigKeyName"`
	TSIGSecretFile string      `yaml:"tsigSecretFile"`
	// TSIGAlgorithm is the key's HMAC (TSIGAlgorithms); empty means the algorithm the
	// secret file's key clause names, else hmac-sha256.
	TSIGAlgorithm string `yaml:"tsigAlgorithm"`
	TTL           int    `yaml:"ttl"`
}

// Etcd is this node's etcd membership: the member it runs, or, on a control plane whose
// etcd runs on etcd nodes (External), the members its API server uses.
type Etcd struct {
	Member  string   `yaml:"member"`
	Members []string `yaml:"members"`
	// Seed is the member that starts a new cluster (the others join it one at a time);
	// default the first of Members.
	Seed string `yaml:"seed"`
	// External says that Members run on etcd nodes, not on this control plane: it runs no
	// member, and its API server uses https://etcd-<member>.internal.<cluster>.<zone>:2379.
	External bool    `yaml:"external"`
	Volume   *Volume `yaml:"volume"`
	// HeartbeatInterval and ElectionTimeout are etcd's Raft timings, as Go durations
	// ("500ms", "5s"); unset keeps etcd's (100ms, 1s). Members whose CPUs stall (emulated,
	// shared or overloaded) call elections without them; every member needs the same.
	HeartbeatInterval string `yaml:"heartbeatInterval"`
	ElectionTimeout   string `yaml:"electionTimeout"`
}

// etcd's own Raft timings, and the longest election timeout it takes.
const (
	defaultEtcdHeartbeat = 100 * time.Millisecond
	defaultEtcdElection  = time.Second
	maxEtcdElection      = 50 * time.Second
)

// EtcdTimings are the etcd flags' values in milliseconds (0 when unset). Valid after Check.
func (e *Etcd) EtcdTimings() (heartbeatMS, electionMS int64) {
	ms := func(s string) int64 {
		d, _ := time.ParseDuration(s)
		return d.Milliseconds()
	}
	return ms(e.HeartbeatInterval), ms(e.ElectionTimeout)
}

// Volume selects and prepares the disk that holds etcd's data. Exactly one of Serial,
// ByID, AWSTags, GCEName and GCELabels selects it.
type Volume struct {
	Serial  string            `yaml:"serial"`
	ByID    string            `yaml:"byId"`
	AWSTags map[string]string `yaml:"awsTags"`
	GCEName string            `yaml:"gceName"`
	// GCELabels selects the one persistent disk in the instance's zone that carries every
	// label ("" matches any value).
	GCELabels map[string]string `yaml:"gceLabels"`
	FSType    string            `yaml:"fsType"`
	Label     string            `yaml:"label"`
	Wipe      bool              `yaml:"wipe"`
	MountPath string            `yaml:"mountPath"`
	// MinSize is the smallest disk accepted, as written ("2GiB", "20GB", bytes); MinBytes
	// is its value, defaultEtcdMinSize when it is not set. 0 accepts any size.
	MinSize  string `yaml:"minSize"`
	MinBytes int64  `yaml:"-"`
}

// Kubernetes holds the cluster-wide Kubernetes settings this node needs.
type Kubernetes struct {
	Version          string            `yaml:"version"`
	PodCIDR          string            `yaml:"podCIDR"`
	ServiceCIDR      string            `yaml:"serviceCIDR"`
	ClusterDNS       string            `yaml:"clusterDNS"`
	ClusterDomain    string            `yaml:"clusterDomain"`
	NodeLabels       map[string]string `yaml:"nodeLabels"`
	KubeletExtraArgs map[string]string `yaml:"kubeletExtraArgs"`
	LeaderElection   LeaderElection    `yaml:"leaderElection"`
}

// LeaderElection tunes how kube-controller-manager and kube-scheduler hold their leader
// leases: Go durations ("15s"); unset fields keep the components' defaults
// (defaultLeaseDuration, defaultRenewDeadline, defaultRetryPeriod). A leader that cannot
// renew its lease within RenewDeadline (each request may take RenewDeadline/2) exits, so
// slow or overloaded control planes (emulated CPUs) need longer ones.
type LeaderElection struct {
	LeaseDuration string `yaml:"leaseDuration"`
	RenewDeadline string `yaml:"renewDeadline"`
	RetryPeriod   string `yaml:"retryPeriod"`
}

// The leader-election defaults of kube-controller-manager and kube-scheduler.
const (
	defaultLeaseDuration = 15 * time.Second
	defaultRenewDeadline = 10 * time.Second
	defaultRetryPeriod   = 2 * time.Second
)

// Defaults.
const (
	DefaultDNSTTL        = 60
	DefaultAPIPort       = 6443
	DefaultPodCIDR       = "10.244.0.0/16"
	DefaultServiceCIDR   = "10.96.0.0/12"
	defaultClusterDomain = "cluster.local"
	defaultEtcdFSType    = "ext4"
	defaultEtcdLabel     = "etcd"
	defaultEtcdMountPath = nodeimage.EtcdDataDir // + "/<cluster.name>"
	// defaultEtcdMinSize is the smallest etcd disk accepted unless etcd.volume.minSize says
	// otherwise: etcd's default space quota (--quota-backend-bytes), so that the database
	// reaches its quota before it fills the disk.
	defaultEtcdMinSize     = 2 << 30
	DefaultEtcdMinSizeText = "2GiB"
)

// clusterFQDN is the cluster's DNS name, <cluster.name>.<cluster.dnsZone>.
func (n *Node) clusterFQDN() string {
	return n.Cluster.Name + "." + n.Cluster.DNSZone
}

// InternalName is the DNS name of a cluster-internal host: api gives
// api.internal.<cluster.name>.<cluster.dnsZone>; etcd members are named etcd-<member>.
func (n *Node) InternalName(host string) string {
	return host + ".internal." + n.clusterFQDN()
}

// LoadNodeIn reads and parses the node config of the node whose root directory is root: its
// nodeimage.NodeConfigPath (see LoadNode).
func LoadNodeIn(root string) (*Node, error) {
	return LoadNode(filepath.Join(root, nodeimage.NodeConfigPath))
}

// LoadNode reads and parses the node config at path (see ParseNode).
func LoadNode(path string) (*Node, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("node config: %w", err)
	}
	return ParseNode(data, path)
}

// ParseNode parses a node config. name is the file name errors start with. Unknown
// fields are errors; every problem is reported (joined), each as a *NodeError such as
// `node.yaml:12: etcd.member: "d" is not one of etcd.members (a, b, c)`. The result has
// every default filled in.
func ParseNode(data []byte, name string) (*Node, error) {
	d := strictyaml.NewDoc(name)
	var n Node
	d.Decode(data, &n)
	if err := d.ErrByLine(); err != nil {
		return nil, err
	}
	n.check(d)
	if err := d.ErrByLine(); err != nil {
		return nil, err
	}
	return &n, nil
}

// check validates n and fills in defaults, reporting problems to d.
func (n *Node) check(d *strictyaml.Doc) {
	n.Cluster.DNSZone = strings.TrimSuffix(n.Cluster.DNSZone, ".")
	switch {
	case n.Cluster.Name == "":
		d.Failf("cluster.name", "is required")
	case !isDNSLabel(n.Cluster.Name):
		d.Failf("cluster.name", "%q is not an RFC 1123 label (lower-case letters, digits and '-', at most 63)", n.Cluster.Name)
	}
	if z := n.Cluster.DNSZone; z != "" && !isDNSName(z) {
		d.Failf("cluster.dnsZone", "%q is not an RFC 1123 DNS name", z)
	}

	switch n.Role {
	case RoleWorker, RoleControlPlane, RoleEtcd:
	case "":
		d.Failf("role", "is required (worker, control-plane or etcd)")
	default:
		d.Failf("role", "%q is not a role (worker, control-plane or etcd)", n.Role)
	}
	needsZone := n.Role == RoleControlPlane || n.Role == RoleEtcd
	if n.Cluster.DNSZone == "" && needsZone {
		d.Failf("cluster.dnsZone", "is required for role %s (etcd and API names live in it)", n.Role)
	}

	if h := n.Hostname; h != "" && !isDNSName(h) {
		d.Failf("hostname", "%q is not an RFC 1123 DNS name (lower-case letters, digits, '-' and '.')", h)
	}

	n.checkDNS(d)
	n.checkEtcd(d)
	n.checkAPIEndpoint(d)
	n.checkKubernetes(d)
	n.checkClouds(d)
}

func (n *Node) checkDNS(d *strictyaml.Doc) {
	dns := &n.DNS
	if dns.Provider == "" {
		dns.Provider = DNSNone
	}
	switch dns.Provider {
	case DNSRFC2136, DNSRoute53, DNSCloudDNS, DNSHosts, DNSNone:
	default:
		d.Failf("dns.provider", "%q is not a provider (rfc2136, route53, clouddns, hosts or none)", dns.Provider)
	}
	if dns.Provider != DNSNone && n.Cluster.DNSZone == "" {
		d.Failf("cluster.dnsZone", "is required with dns.provider %s", dns.Provider)
	}
	dns.Zone = strings.TrimSuffix(dns.Zone, ".")
	if dns.Zone == "" {
		dns.Zone = n.Cluster.DNSZone
	}
	if dns.Zone != "" && n.Cluster.DNSZone != "" {
		switch fqdn := n.clusterFQDN(); {
		case !isDNSName(dns.Zone):
			d.Failf("dns.zone", "%q is not an RFC 1123 DNS name", dns.Zone)
		case fqdn != dns.Zone && !strings.HasSuffix(fqdn, "."+dns.Zone):
			d.Failf("dns.zone", "the cluster's names (*.internal.%s) are not inside zone %s", fqdn, dns.Zone)
		}
	}
	if dns.TTL == 0 {
		dns.TTL = DefaultDNSTTL
	}
	if dns.TTL < 1 || dns.TTL > 86400 {
		d.Failf("dns.ttl", "%d is not between 1 and 86400 seconds", dns.TTL)
	}
	if dns.Provider != DNSRFC2136 {
		for field, v := range map[string]string{"dns.server": dns.Server, "dns.tsigKeyName": dns.TSIGKeyName, "dns.tsigSecretFile": dns.TSIGSecretFile, "dns.tsigAlgorithm": dns.TSIGAlgorithm} {
			if v != "" {
				d.Failf(field, "is only used with dns.provider rfc2136 (provider is %s)", dns.Provider)
			}
		}
		return
	}
	if dns.Server == "" {
		d.Failf("dns.server", "is required with dns.provider rfc2136 (host or host:port of the authoritative server)")
	} else if hp, err := hostPort(dns.Server, 53); err != nil {
		d.Failf("dns.server", "%v", err)
	} else {
		dns.Server = hp
	}
	switch {
	case (dns.TSIGKeyName == "") != (dns.TSIGSecretFile == ""):
		d.Failf("dns.tsigKeyName", "tsigKeyName and tsigSecretFile go together: set both or neither")
	case dns.TSIGKeyName != "" && !isDNSName(strings.TrimSuffix(dns.TSIGKeyName, ".")):
		d.Failf("dns.tsigKeyName", "%q is not a DNS name", dns.TSIGKeyName)
	case dns.TSIGSecretFile != "" && (!path.IsAbs(dns.TSIGSecretFile) || path.Clean(dns.TSIGSecretFile) != dns.TSIGSecretFile):
		d.Failf("dns.tsigSecretFile", "%q must be a clean absolute path", dns.TSIGSecretFile)
	}
}

func (n *Node) checkEtcd(d *strictyaml.Doc) {
	wantEtcd := n.Role == RoleControlPlane || n.Role == RoleEtcd
	e := n.Etcd
	switch {
	case e == nil && wantEtcd:
		d.Failf("etcd", "is required for role %s (member, members)", n.Role)
		return
	case e == nil:
		return
	case n.Role == RoleWorker:
		d.Failf("etcd", "a worker node runs no etcd member; remove etcd or change role")
		return
	}
	if e.External {
		n.checkExternalEtcd(d)
		return
	}
	switch {
	case e.Member == "":
		d.Failf("etcd.member", "is required")
	case !isDNSLabel(e.Member):
		d.Failf("etcd.member", "%q is not an RFC 1123 label", e.Member)
	}
	n.checkEtcdMembers(d)
	if e.Member != "" && len(e.Members) > 0 && !slices.Contains(e.Members, e.Member) {
		d.Failf("etcd.member", "%q is not one of etcd.members (%s)", e.Member, strings.Join(e.Members, ", "))
	}
	switch {
	case e.Seed == "" && len(e.Members) > 0:
		e.Seed = e.Members[0]
	case e.Seed != "" && len(e.Members) > 0 && !slices.Contains(e.Members, e.Seed):
		d.Failf("etcd.seed", "%q is not one of etcd.members (%s)", e.Seed, strings.Join(e.Members, ", "))
	}
	if e.Volume != nil {
		n.checkVolume(d, e.Volume)
	}
	n.checkEtcdTimings(d)
}

// checkEtcdMembers checks etcd.members: required, labels, none twice.
func (n *Node) checkEtcdMembers(d *strictyaml.Doc) {
	e := n.Etcd
	if len(e.Members) == 0 {
		d.Failf("etcd.members", "is required: the names of all members, this one included")
	}
	for i, m := range e.Members {
		field := fmt.Sprintf("etcd.members[%d]", i)
		switch {
		case !isDNSLabel(m):
			d.Failf(field, "%q is not an RFC 1123 label", m)
		case slices.Index(e.Members, m) < i:
			d.Failf(field, "%q is listed twice", m)
		}
	}
}

// checkExternalEtcd checks the etcd of a control plane whose members run on etcd nodes:
// members names them; what configures a member of its own is refused.
func (n *Node) checkExternalEtcd(d *strictyaml.Doc) {
	e := n.Etcd
	if n.Role != RoleControlPlane {
		d.Failf("etcd.external", "only a control plane uses an external etcd (role is %s)", n.Role)
		return
	}
	if len(e.Members) == 0 {
		d.Failf("etcd.members", "is required with etcd.external: the etcd nodes' member names")
	} else {
		n.checkEtcdMembers(d)
	}
	if n.Cluster.DNSZone == "" {
		d.Failf("cluster.dnsZone", "is required with etcd.external (the members are etcd-<member>.internal.<cluster.name>.<cluster.dnsZone>)")
	}
	for field, set := range map[string]bool{"etcd.member": e.Member != "", "etcd.seed": e.Seed != "",
		"etcd.volume": e.Volume != nil, "etcd.heartbeatInterval": e.HeartbeatInterval != "",
		"etcd.electionTimeout": e.ElectionTimeout != ""} {
		if set {
			d.Failf(field, "is for a node that runs an etcd member; with etcd.external this control plane runs none")
		}
	}
}

// checkEtcdTimings checks the Raft timings as etcd does at start: whole milliseconds, the
// election timeout at least five heartbeats and at most 50 s.
func (n *Node) checkEtcdTimings(d *strictyaml.Doc) {
	e := n.Etcd
	wholeMS := func(v time.Duration) bool { return v >= time.Millisecond && v%time.Millisecond == 0 }
	const want = "a duration of whole milliseconds like 500ms"
	hb, ok1 := durationField(d, "etcd.heartbeatInterval", e.HeartbeatInterval, defaultEtcdHeartbeat, wholeMS, want)
	el, ok2 := durationField(d, "etcd.electionTimeout", e.ElectionTimeout, defaultEtcdElection, wholeMS, want)
	if !ok1 || !ok2 {
		return
	}
	switch {
	case el < 5*hb:
		d.Failf("etcd.electionTimeout", "%s must be at least 5 × heartbeatInterval (%s)", el, hb)
	case el > maxEtcdElection:
		d.Failf("etcd.electionTimeout", "%s is longer than etcd takes (%s)", el, maxEtcdElection)
	}
}

func (n *Node) checkVolume(d *strictyaml.Doc, v *Volume) {
	set := 0
	for _, s := range []bool{v.Serial != "", v.ByID != "", len(v.AWSTags) > 0, v.GCEName != "", len(v.GCELabels) > 0} {
		if s {
			set++
		}
	}
	if set != 1 {
		d.Failf("etcd.volume", "set exactly one of serial, byId, awsTags, gceName and gceLabels (%d are set)", set)
	}
	if v.Serial != "" && strings.ContainsAny(v.Serial, "/ \t\n") {
		d.Failf("etcd.volume.serial", "%q must not contain '/' or spaces", v.Serial)
	}
	if id := v.ByID; id != "" {
		name := strings.TrimPrefix(id, "/dev/disk/by-id/")
		if name == "" || strings.ContainsAny(name, "/ \t\n") {
			d.Failf("etcd.volume.byId", "%q is neither a name in /dev/disk/by-id nor /dev/disk/by-id/<name>", id)
		}
	}
	for k := range v.AWSTags {
		if k == "" || len(k) > 128 {
			d.Failf(strictyaml.MapKey("etcd.volume.awsTags", k), "an AWS tag key has 1 to 128 characters")
		}
	}
	if g := v.GCEName; g != "" && !isRFC1035Label(g) {
		d.Failf("etcd.volume.gceName", "%q is not a GCE disk name (lower-case letter first, then letters, digits and '-', at most 63)", g)
	}
	checkGCELabels(d, v.GCELabels)
	if v.FSType == "" {
		v.FSType = defaultEtcdFSType
	}
	maxLabel := map[string]int{"ext4": 16, "xfs": 12}[v.FSType]
	if maxLabel == 0 {
		d.Failf("etcd.volume.fsType", "%q is not supported (ext4 or xfs)", v.FSType)
	}
	if v.Label == "" {
		v.Label = defaultEtcdLabel
	}
	if maxLabel > 0 && len(v.Label) > maxLabel {
		d.Failf("etcd.volume.label", "%q is longer than the %d bytes %s allows", v.Label, maxLabel, v.FSType)
	}
	if v.MountPath == "" {
		// One directory per cluster, as etcd-manager mounts them.
		v.MountPath = path.Join(defaultEtcdMountPath, n.Cluster.Name)
	}
	if !path.IsAbs(v.MountPath) || path.Clean(v.MountPath) != v.MountPath || v.MountPath == "/" {
		d.Failf("etcd.volume.mountPath", "%q must be a clean absolute path below /", v.MountPath)
	}
	v.MinBytes = defaultEtcdMinSize
	if v.MinSize != "" {
		n, err := parseSize(v.MinSize)
		if err != nil {
			d.Failf("etcd.volume.minSize", "%v", err)
		}
		v.MinBytes = n
	}
}

// sizeUnits are the units parseSize knows: powers of 1024 and of 1000.
var sizeUnits = []struct {
	name string
	mult int64
}{
	{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10},
	{"TB", 1e12}, {"GB", 1e9}, {"MB", 1e6}, {"KB", 1e3}, {"B", 1},
}

// parseSize reads a number of bytes: "2GiB", "20 GB", "1073741824".
func parseSize(s string) (int64, error) {
	t, mult := strings.TrimSpace(s), int64(1)
	for _, u := range sizeUnits {
		if num, ok := strings.CutSuffix(t, u.name); ok {
			t, mult = strings.TrimSpace(num), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%q is not a size: want a whole number of bytes, or one with a unit (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB), e.g. 20GiB", s)
	}
	if n > (1<<63-1)/mult {
		return 0, fmt.Errorf("%q is too large", s)
	}
	return n * mult, nil
}

func (n *Node) checkAPIEndpoint(d *strictyaml.Doc) {
	if n.APIEndpoint == "" {
		if n.Cluster.DNSZone == "" || n.Cluster.Name == "" {
			d.Failf("apiEndpoint", "is required when cluster.dnsZone is not set (host:port of the Kubernetes API)")
			return
		}
		n.APIEndpoint = net.JoinHostPort(n.InternalName("api"), strconv.Itoa(DefaultAPIPort))
		return
	}
	host, port, err := net.SplitHostPort(n.APIEndpoint)
	if err != nil {
		d.Failf("apiEndpoint", "%q is not host:port (e.g. api.example.com:6443)", n.APIEndpoint)
		return
	}
	if err := checkHost(host); err != nil {
		d.Failf("apiEndpoint", "%v", err)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		d.Failf("apiEndpoint", "port %q is not between 1 and 65535", port)
	}
}

var kubeVersion = regexp.MustCompile(`^v[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$`)

func (n *Node) checkKubernetes(d *strictyaml.Doc) {
	k := &n.Kubernetes
	if k.Version != "" && !kubeVersion.MatchString(k.Version) {
		d.Failf("kubernetes.version", "%q is not a version like v1.37.2", k.Version)
	}
	if k.PodCIDR == "" {
		k.PodCIDR = DefaultPodCIDR
	}
	if k.ServiceCIDR == "" {
		k.ServiceCIDR = DefaultServiceCIDR
	}
	pods, podErr := parseCIDRs(k.PodCIDR, 0, 0)
	if podErr != nil {
		d.Failf("kubernetes.podCIDR", "%v", podErr)
	}
	// kube-apiserver refuses service ranges larger than /12 (IPv4) or /108 (IPv6).
	services, svcErr := parseCIDRs(k.ServiceCIDR, 12, 108)
	if svcErr != nil {
		d.Failf("kubernetes.serviceCIDR", "%v", svcErr)
	}
	if podErr == nil && svcErr == nil {
		for _, p := range pods {
			for _, s := range services {
				if p.Overlaps(s) {
					d.Failf("kubernetes.serviceCIDR", "%s overlaps podCIDR %s", s, p)
				}
			}
		}
	}
	if k.ClusterDNS == "" && svcErr == nil {
		// The tenth address of the first service range, as kubeadm does.
		ip := services[0].Addr()
		for range 10 {
			ip = ip.Next()
		}
		k.ClusterDNS = ip.String()
	}
	if ip, err := netip.ParseAddr(k.ClusterDNS); err != nil {
		if k.ClusterDNS != "" {
			d.Failf("kubernetes.clusterDNS", "%q is not an IP address", k.ClusterDNS)
		}
	} else if svcErr == nil && !slices.ContainsFunc(services, func(p netip.Prefix) bool { return p.Contains(ip) }) {
		d.Failf("kubernetes.clusterDNS", "%s is not inside serviceCIDR %s", ip, k.ServiceCIDR)
	}
	if k.ClusterDomain == "" {
		k.ClusterDomain = defaultClusterDomain
	}
	if !isDNSName(k.ClusterDomain) {
		d.Failf("kubernetes.clusterDomain", "%q is not an RFC 1123 DNS name", k.ClusterDomain)
	}
	for key, val := range k.NodeLabels {
		field := strictyaml.MapKey("kubernetes.nodeLabels", key)
		if err := checkLabel(key, val); err != nil {
			d.Failf(field, "%v", err)
		}
	}
	n.checkLeaderElection(d)
	for i, name := range n.Preflight.Ignore {
		if !isDNSLabel(name) {
			d.Failf(fmt.Sprintf("preflight.ignore[%d]", i), "%q is not a check name (cpus, memory, swap, port-6443, …, or all)", name)
		}
	}
	for flag, val := range k.KubeletExtraArgs {
		field := strictyaml.MapKey("kubernetes.kubeletExtraArgs", flag)
		switch {
		case strings.HasPrefix(flag, "-"):
			d.Failf(field, "write the flag name without leading dashes (%s)", strings.TrimLeft(flag, "-"))
		case !kubeletFlag.MatchString(flag):
			d.Failf(field, "%q is not a kubelet flag name", flag)
		case strings.ContainsAny(val, "\n\x00"):
			d.Failf(field, "the value must be one line")
		}
	}
}

var kubeletFlag = regexp.MustCompile(`^[a-z0-9][a-z0-9-]*$`)

// parseCIDRs parses one range or a dual-stack pair "v4,v6". minBits4/6 bound how large
// a range may be (0: no bound).
func parseCIDRs(s string, minBits4, minBits6 int) ([]netip.Prefix, error) {
	parts := strings.Split(s, ",")
	if len(parts) > 2 {
		return nil, fmt.Errorf("%q: at most two ranges (one IPv4, one IPv6)", s)
	}
	var out []netip.Prefix
	for _, part := range parts {
		p, err := netip.ParsePrefix(strings.TrimSpace(part))
		if err != nil {
			return nil, fmt.Errorf("%q is not a CIDR range like 10.96.0.0/12", strings.TrimSpace(part))
		}
		if p.Masked() != p {
			return nil, fmt.Errorf("%s has host bits set (the range is %s)", p, p.Masked())
		}
		if min := map[bool]int{true: minBits4, false: minBits6}[p.Addr().Is4()]; p.Bits() < min {
			return nil, fmt.Errorf("%s is too large (at most /%d)", p, min)
		}
		out = append(out, p)
	}
	if len(out) == 2 && out[0].Addr().Is4() == out[1].Addr().Is4() {
		return nil, fmt.Errorf("%q: a dual-stack pair is one IPv4 and one IPv6 range", s)
	}
	return out, nil
}

// hostPort checks host[:port] and returns it with the default port added.
func hostPort(s string, defPort int) (string, error) {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		host, port = strings.Trim(s, "[]"), strconv.Itoa(defPort)
	}
	if err := checkHost(host); err != nil {
		return "", err
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return "", fmt.Errorf("port %q is not between 1 and 65535", port)
	}
	return net.JoinHostPort(host, port), nil
}

func checkHost(h string) error {
	if _, err := netip.ParseAddr(h); err == nil {
		return nil
	}
	if !isDNSName(strings.TrimSuffix(h, ".")) {
		return fmt.Errorf("host %q is neither an IP address nor a DNS name", h)
	}
	return nil
}

var (
	dnsLabel     = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
	rfc1035Label = regexp.MustCompile(`^[a-z]([a-z0-9-]{0,61}[a-z0-9])?$`)
)

// isDNSLabel: an RFC 1123 label as Kubernetes checks it.
func isDNSLabel(s string) bool { return dnsLabel.MatchString(s) }

func isRFC1035Label(s string) bool { return rfc1035Label.MatchString(s) }

// isDNSName: an RFC 1123 subdomain as Kubernetes checks it (node names, domains).
func isDNSName(s string) bool {
	if s == "" || len(s) > 253 {
		return false
	}
	for _, l := range strings.Split(s, ".") {
		if !isDNSLabel(l) {
			return false
		}
	}
	return true
}

var labelName = regexp.MustCompile(`^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$`)

// kubeletLabels are the kubernetes.io labels a kubelet may set on its own node (the
// NodeRestriction admission plugin refuses the others, node-role.kubernetes.io/* among
// them).
var kubeletLabels = []string{
	"kubernetes.io/hostname", "kubernetes.io/arch", "kubernetes.io/os",
	"beta.kubernetes.io/arch", "beta.kubernetes.io/os", "beta.kubernetes.io/instance-type",
	"node.kubernetes.io/instance-type",
	"failure-domain.beta.kubernetes.io/region", "failure-domain.beta.kubernetes.io/zone",
	"topology.kubernetes.io/region", "topology.kubernetes.io/zone",
}

// checkLabel checks a Kubernetes label key and value, and that a kubelet may set it.
func checkLabel(key, val string) error {
	prefix, name, hasPrefix := strings.Cut(key, "/")
	if !hasPrefix {
		prefix, name = "", key
	}
	switch {
	case name == "" || len(name) > 63 || !labelName.MatchString(name):
		return fmt.Errorf("%q is not a label key (name: at most 63 letters, digits, '-', '_', '.')", key)
	case hasPrefix && !isDNSName(prefix):
		return fmt.Errorf("label key prefix %q is not a DNS name", prefix)
	case len(val) > 63 || !labelName.MatchString(val):
		return fmt.Errorf("value %q is not a label value (at most 63 letters, digits, '-', '_', '.')", val)
	}
	restricted := func(ns string) bool { return prefix == ns || strings.HasSuffix(prefix, "."+ns) }
	allowed := restricted("kubelet.kubernetes.io") || restricted("node.kubernetes.io") || slices.Contains(kubeletLabels, key)
	if (restricted("kubernetes.io") || restricted("k8s.io")) && !allowed {
		return errors.New("a kubelet may not set labels in the kubernetes.io and k8s.io namespaces except node.kubernetes.io/* and kubelet.kubernetes.io/* (kiln sets node-role labels itself)")
	}
	return nil
}

// durationField is the Go duration s of field, def when s is empty. One that does not parse
// or that valid refuses fails the field ("<s> is not <want>") and returns false.
func durationField(d *strictyaml.Doc, field, s string, def time.Duration, valid func(time.Duration) bool, want string) (time.Duration, bool) {
	if s == "" {
		return def, true
	}
	v, err := time.ParseDuration(s)
	if err != nil || !valid(v) {
		d.Failf(field, "%q is not %s", s, want)
		return 0, false
	}
	return v, true
}

// checkLeaderElection checks the lease timings as the components do at start: each a positive
// duration, leaseDuration > renewDeadline > 1.2 × retryPeriod (the retries' jitter).
func (n *Node) checkLeaderElection(d *strictyaml.Doc) {
	le := n.Kubernetes.LeaderElection
	positive := func(v time.Duration) bool { return v > 0 }
	const want = "a positive duration like 15s"
	lease, ok1 := durationField(d, "kubernetes.leaderElection.leaseDuration", le.LeaseDuration, defaultLeaseDuration, positive, want)
	renew, ok2 := durationField(d, "kubernetes.leaderElection.renewDeadline", le.RenewDeadline, defaultRenewDeadline, positive, want)
	retry, ok3 := durationField(d, "kubernetes.leaderElection.retryPeriod", le.RetryPeriod, defaultRetryPeriod, positive, want)
	if !ok1 || !ok2 || !ok3 {
		return
	}
	if lease <= renew {
		d.Failf("kubernetes.leaderElection.leaseDuration", "%s must be longer than renewDeadline (%s)", lease, renew)
	}
	if renew*5 <= retry*6 {
		d.Failf("kubernetes.leaderElection.renewDeadline", "%s must be longer than 1.2 × retryPeriod (%s)", renew, retry)
	}
}
