package config

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

const controlPlaneNode = `# a control-plane node of cluster prod
cluster:
  name: prod
  dnsZone: k8s.example.com.
role: control-plane
hostname: cp-1
dns:
  provider: rfc2136
  server: 10.0.0.53
  tsigKeyName: kiln-update.
  tsigSecretFile: /etc/kiln/tsig.key
etcd:
  member: b
  members: [a, b, c]
  volume:
    serial: etcd-main
    wipe: true
kubernetes:
  version: v1.37.2
  nodeLabels:
    example.com/pool: blue
    node.kubernetes.io/exclude-from-external-load-balancers: ""
  kubeletExtraArgs:
    max-pods: "200"
`

func TestParseNodeDefaults(t *testing.T) {
	n, err := ParseNode([]byte(controlPlaneNode), "node.yaml")
	if err != nil {
		t.Fatalf("ParseNode: %v", err)
	}
	want := &Node{
		Cluster:  Cluster{Name: "prod", DNSZone: "k8s.example.com"},
		Role:     RoleControlPlane,
		Hostname: "cp-1",
		DNS: DNS{Provider: DNSRFC2136, Server: "10.0.0.53:53", Zone: "k8s.example.com",
			TSIGKeyName: "kiln-update.", TSIGSecretFile: "/etc/kiln/tsig.key", TTL: 60},
		Etcd: &Etcd{Member: "b", Members: []string{"a", "b", "c"}, Seed: "a",
			Volume: &Volume{Serial: "etcd-main", FSType: "ext4", Label: "etcd", Wipe: true, MountPath: "/var/lib/etcd/prod", MinBytes: 2 << 30}},
		APIEndpoint: "api.internal.prod.k8s.example.com:6443",
		Kubernetes: Kubernetes{Version: "v1.37.2", PodCIDR: "10.244.0.0/16", ServiceCIDR: "10.96.0.0/12",
			ClusterDNS: "10.96.0.10", ClusterDomain: "cluster.local",
			NodeLabels:       map[string]string{"example.com/pool": "blue", "node.kubernetes.io/exclude-from-external-load-balancers": ""},
			KubeletExtraArgs: map[string]string{"max-pods": "200"}},
		AWS: AWS{EtcdCluster: "main"},
	}
	if !reflect.DeepEqual(n, want) {
		t.Errorf("ParseNode =\n%+v\nwant\n%+v", n, want)
	}
	if got := n.InternalName("etcd-" + n.Etcd.Member); got != "etcd-b.internal.prod.k8s.example.com" {
		t.Errorf("InternalName = %q", got)
	}
}

func TestParseNodeMinimal(t *testing.T) {
	tests := []struct {
		name, doc string
		check     func(*Node) bool
	}{
		{"worker with a zone", "cluster: {name: prod, dnsZone: example.com}\nrole: worker\n",
			func(n *Node) bool {
				return n.Etcd == nil && n.DNS.Provider == DNSNone && n.APIEndpoint == "api.internal.prod.example.com:6443"
			}},
		{"worker with only an endpoint", "cluster: {name: lab}\nrole: worker\napiEndpoint: 192.168.1.10:6443\n",
			func(n *Node) bool { return n.APIEndpoint == "192.168.1.10:6443" && n.DNS.Zone == "" }},
		{"dual stack, IPv6 endpoint", "cluster: {name: lab}\nrole: worker\napiEndpoint: \"[fd00::1]:6443\"\nkubernetes:\n  podCIDR: 10.244.0.0/16,fd00:10:244::/56\n  serviceCIDR: fd00:10:96::/112,10.96.0.0/16\n",
			func(n *Node) bool { return n.Kubernetes.ClusterDNS == "fd00:10:96::a" }},
		{"etcd node, aws volume, xfs", "cluster: {name: prod, dnsZone: example.com}\nrole: etcd\ndns: {provider: route53, zone: example.com, ttl: 300}\netcd:\n  member: a\n  members: [a]\n  volume:\n    awsTags: {k8s.io/etcd/main: a/a, kubernetes.io/cluster/prod: owned}\n    fsType: xfs\n    label: etcd-main\n    mountPath: /var/lib/etcd-main\n",
			func(n *Node) bool {
				return n.Etcd.Volume.FSType == "xfs" && len(n.Etcd.Volume.AWSTags) == 2 && n.DNS.TTL == 300
			}},
		{"etcd volume minimum in GiB", "cluster: {name: prod, dnsZone: example.com}\nrole: etcd\netcd: {member: a, members: [a], volume: {serial: etcd-main, minSize: 20GiB}}\n",
			func(n *Node) bool { return n.Etcd.Volume.MinBytes == 20<<30 }},
		{"etcd volume minimum in bytes", "cluster: {name: prod, dnsZone: example.com}\nrole: etcd\netcd: {member: a, members: [a], volume: {serial: etcd-main, minSize: 1073741824}}\n",
			func(n *Node) bool { return n.Etcd.Volume.MinBytes == 1<<30 }},
		{"etcd volume minimum in GB", "cluster: {name: prod, dnsZone: example.com}\nrole: etcd\netcd: {member: a, members: [a], volume: {serial: etcd-main, minSize: 8 GB}}\n",
			func(n *Node) bool { return n.Etcd.Volume.MinBytes == 8e9 }},
		{"etcd volume without a minimum", "cluster: {name: prod, dnsZone: example.com}\nrole: etcd\netcd: {member: a, members: [a], volume: {serial: etcd-main, minSize: 0}}\n",
			func(n *Node) bool { return n.Etcd.Volume.MinBytes == 0 }},
		{"empty values keep defaults", "cluster: {name: prod, dnsZone: example.com}\nrole: worker\ndns:\nkubernetes: ~\n",
			func(n *Node) bool { return n.Kubernetes.PodCIDR == DefaultPodCIDR && n.DNS.TTL == DefaultDNSTTL }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n, err := ParseNode([]byte(tc.doc), "node.yaml")
			if err != nil {
				t.Fatalf("ParseNode: %v", err)
			}
			if !tc.check(n) {
				t.Errorf("unexpected node %+v", n)
			}
		})
	}
}

// nodeErrorCase is a node.yaml and the problems ParseNode finds in it.
type nodeErrorCase struct {
	name string
	doc  string
	want []string // each a full line of the error
}

func TestParseNodeErrors(t *testing.T) {
	for _, tc := range nodeErrorCases() {
		t.Run(tc.name, func(t *testing.T) {
			n, err := ParseNode([]byte(tc.doc), "node.yaml")
			if err == nil {
				t.Fatalf("ParseNode accepted it: %+v", n)
			}
			lines := strings.Split(err.Error(), "\n")
			for _, w := range tc.want {
				found := false
				for _, l := range lines {
					found = found || strings.HasPrefix(l, w)
				}
				if !found {
					t.Errorf("error lacks a line starting %q; got:\n%v", w, err)
				}
			}
			if len(lines) != len(tc.want) {
				t.Errorf("got %d error lines, want %d:\n%v", len(lines), len(tc.want), err)
			}
			var ne *NodeError
			if !errors.As(err, &ne) || ne.File != "node.yaml" {
				t.Errorf("error is not a *NodeError for node.yaml: %#v", err)
			}
		})
	}
}

func TestLoadNode(t *testing.T) {
	p := filepath.Join(t.TempDir(), "node.yaml")
	if err := os.WriteFile(p, []byte("cluster: {name: prod, dnsZone: example.com}\nrole: wroker\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := LoadNode(p)
	if err == nil || err.Error() != p+`:2: role: "wroker" is not a role (worker, control-plane or etcd)` {
		t.Errorf("LoadNode error = %v", err)
	}
	if _, err := LoadNode(filepath.Join(t.TempDir(), "missing.yaml")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("LoadNode(missing) = %v, want ErrNotExist", err)
	}
}

func FuzzParseNode(f *testing.F) {
	f.Add([]byte(controlPlaneNode))
	f.Add([]byte("cluster: {name: lab}\nrole: worker\napiEndpoint: \"[fd00::1]:6443\"\nkubernetes:\n  podCIDR: 10.244.0.0/16,fd00:10:244::/56\n  serviceCIDR: fd00:10:96::/112,10.96.0.0/16\n"))
	f.Add([]byte("cluster: {name: prod, dnsZone: example.com}\nrole: etcd\netcd:\n  member: a\n  members: [a]\n  volume:\n    awsTags: {k8s.io/etcd/main: a/a}\n"))
	f.Add([]byte("a: &x [1, 2]\nb: *x\n"))
	f.Add([]byte("role: worker\n---\nrole: etcd\n"))
	f.Add([]byte("cluster: prod\nrole: [worker]\ndns: {ttl: soon}\n"))
	f.Add([]byte("kubernetes: {nodeLabels: &l {a: b}, kubeletExtraArgs: *l}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		n, err := ParseNode(data, "node.yaml")
		if err != nil {
			if n != nil {
				t.Fatal("ParseNode returned a node with an error")
			}
			for _, line := range strings.Split(err.Error(), "\n") {
				if !strings.HasPrefix(line, "node.yaml") {
					t.Fatalf("error line %q does not name the file", line)
				}
			}
			return
		}
		// A valid node has every default filled in and its invariants hold.
		switch {
		case n.Cluster.Name == "" || n.APIEndpoint == "" || n.DNS.Provider == "" || n.DNS.TTL == 0:
			t.Fatalf("defaults missing: %+v", n)
		case n.Kubernetes.PodCIDR == "" || n.Kubernetes.ServiceCIDR == "" || n.Kubernetes.ClusterDNS == "" || n.Kubernetes.ClusterDomain == "":
			t.Fatalf("kubernetes defaults missing: %+v", n.Kubernetes)
		case (n.Role == RoleControlPlane || n.Role == RoleEtcd) != (n.Etcd != nil):
			t.Fatalf("role %s with etcd %v", n.Role, n.Etcd)
		}
		// Parsing is deterministic.
		again, err := ParseNode(data, "node.yaml")
		if err != nil || !reflect.DeepEqual(n, again) {
			t.Fatalf("second parse differs: %v", err)
		}
	})
}

func nodeErrorCases() []nodeErrorCase {
	return []nodeErrorCase{
		{"empty", "", []string{"node.yaml: the document is empty"}},
		{"only a comment", "# nothing\n", []string{"node.yaml: the document is empty"}},
		{"not a mapping", "- a\n", []string{"node.yaml:1: expected a mapping at the top level, got a list"}},
		{"bad YAML", "cluster: {name: x\n", []string{"node.yaml:2: invalid YAML: did not find expected ',' or '}'"}},
		{"bad YAML names the line the flow mapping starts", "role: worker\ncluster: {name: x\nhostname: h\n", []string{"node.yaml:2: invalid YAML: did not find expected ',' or '}'"}},
		{"two documents", "role: worker\n---\nrole: etcd\n", []string{"node.yaml:2: more than one YAML document; expected one"}},
		{"unknown field", "cluster: {name: prod, dnsZone: example.com}\nrole: worker\nkubernetes:\n  podCidr: 10.0.0.0/16\n",
			[]string{"node.yaml:4: kubernetes.podCidr: unknown field (known: clusterDNS, clusterDomain, kubeletExtraArgs, leaderElection, nodeLabels, podCIDR, serviceCIDR, version)"}},
		{"duplicate key", "role: worker\nrole: etcd\n", []string{"node.yaml:2: role: set twice (first at line 1)"}},
		{"wrong types", "cluster: prod\nrole: [worker]\ndns: {ttl: soon}\netcd: {volume: {wipe: maybe}}\n", []string{
			`node.yaml:1: cluster: expected a mapping, got the string "prod"`,
			"node.yaml:2: role: expected a string, got a list",
			`node.yaml:3: dns.ttl: expected an integer, got the string "soon"`,
			`node.yaml:4: etcd.volume.wipe: expected true or false, got the string "maybe"`}},
		{"required fields", "dns: {provider: none}\n", []string{
			"node.yaml: cluster.name: is required",
			"node.yaml: role: is required (worker, control-plane or etcd)",
			"node.yaml: apiEndpoint: is required when cluster.dnsZone is not set"}},
		{"control plane without etcd", "cluster: {name: prod, dnsZone: example.com}\nrole: control-plane\n",
			[]string{"node.yaml: etcd: is required for role control-plane (member, members)"}},
		{"worker with etcd", "cluster: {name: prod, dnsZone: example.com}\nrole: worker\netcd: {member: a, members: [a]}\n",
			[]string{"node.yaml:3: etcd: a worker node runs no etcd member"}},
		{"etcd membership", "cluster: {name: prod, dnsZone: example.com}\nrole: etcd\netcd:\n  member: d\n  members:\n    - a\n    - B\n    - a\n", []string{
			`node.yaml:4: etcd.member: "d" is not one of etcd.members (a, B, a)`,
			`node.yaml:7: etcd.members[1]: "B" is not an RFC 1123 label`,
			`node.yaml:8: etcd.members[2]: "a" is listed twice`}},
		{"etcd seed", "cluster: {name: prod, dnsZone: example.com}\nrole: etcd\netcd:\n  member: a\n  members: [a, b]\n  seed: c\n",
			[]string{`node.yaml:6: etcd.seed: "c" is not one of etcd.members (a, b)`}},
		{"external etcd on an etcd node", "cluster: {name: prod, dnsZone: example.com}\nrole: etcd\netcd: {members: [a], external: true}\n",
			[]string{"node.yaml:3: etcd.external: only a control plane uses an external etcd (role is etcd)"}},
		{"external etcd with a member of its own", "cluster: {name: prod, dnsZone: example.com}\nrole: control-plane\netcd:\n  external: true\n  member: a\n  seed: a\n  volume: {serial: etcd-main}\n  electionTimeout: 5s\n", []string{
			"node.yaml:3: etcd.members: is required with etcd.external: the etcd nodes' member names",
			"node.yaml:5: etcd.member: is for a node that runs an etcd member; with etcd.external this control plane runs none",
			"node.yaml:6: etcd.seed: is for a node that runs an etcd member",
			"node.yaml:7: etcd.volume: is for a node that runs an etcd member",
			"node.yaml:8: etcd.electionTimeout: is for a node that runs an etcd member"}},
		{"etcd volume", "cluster: {name: prod, dnsZone: example.com}\nrole: etcd\netcd:\n  member: a\n  members: [a]\n  volume:\n    serial: x\n    gceName: y\n    fsType: btrfs\n    mountPath: var/lib/etcd\n", []string{
			"node.yaml:6: etcd.volume: set exactly one of serial, byId, awsTags, gceName and gceLabels (2 are set)",
			`node.yaml:9: etcd.volume.fsType: "btrfs" is not supported (ext4 or xfs)`,
			`node.yaml:10: etcd.volume.mountPath: "var/lib/etcd" must be a clean absolute path below /`}},
		{"etcd volume minimum", "cluster: {name: prod, dnsZone: example.com}\nrole: etcd\netcd:\n  member: a\n  members: [a]\n  volume:\n    serial: etcd-main\n    minSize: 2 gigs\n",
			[]string{`node.yaml:8: etcd.volume.minSize: "2 gigs" is not a size: want a whole number of bytes, or one with a unit (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB), e.g. 20GiB`}},
		{"xfs label", "cluster: {name: prod, dnsZone: example.com}\nrole: etcd\netcd: {member: a, members: [a], volume: {byId: /dev/disk/by-id/virtio-etcd, fsType: xfs, label: etcd-main-disk}}\n",
			[]string{`node.yaml:3: etcd.volume.label: "etcd-main-disk" is longer than the 12 bytes xfs allows`}},
		{"dns", "cluster: {name: prod, dnsZone: example.com}\nrole: worker\ndns:\n  provider: bind\n  zone: other.org\n  ttl: -1\n", []string{
			`node.yaml:4: dns.provider: "bind" is not a provider (rfc2136, route53, clouddns, hosts or none)`,
			"node.yaml:5: dns.zone: the cluster's names (*.internal.prod.example.com) are not inside zone other.org",
			"node.yaml:6: dns.ttl: -1 is not between 1 and 86400 seconds"}},
		{"rfc2136", "cluster: {name: prod, dnsZone: example.com}\nrole: worker\ndns:\n  provider: rfc2136\n  tsigKeyName: k\n", []string{
			"node.yaml:3: dns.server: is required with dns.provider rfc2136",
			"node.yaml:5: dns.tsigKeyName: tsigKeyName and tsigSecretFile go together"}},
		{"provider without a zone", "cluster: {name: prod}\nrole: worker\napiEndpoint: 10.0.0.1:6443\ndns: {provider: hosts}\n",
			[]string{"node.yaml:1: cluster.dnsZone: is required with dns.provider hosts"}},
		{"api endpoint", "cluster: {name: prod, dnsZone: example.com}\nrole: worker\napiEndpoint: api.example.com\n",
			[]string{`node.yaml:3: apiEndpoint: "api.example.com" is not host:port (e.g. api.example.com:6443)`}},
		{"kubernetes", "cluster: {name: prod, dnsZone: example.com}\nrole: worker\nkubernetes:\n  version: 1.37\n  podCIDR: 10.244.0.1/16\n  serviceCIDR: 10.0.0.0/8\n  clusterDNS: ten\n  clusterDomain: Cluster.Local\n  nodeLabels:\n    node-role.kubernetes.io/worker: \"\"\n    bad key: x\n  kubeletExtraArgs:\n    --max-pods: \"1\"\n", []string{
			`node.yaml:4: kubernetes.version: "1.37" is not a version like v1.37.2`,
			"node.yaml:5: kubernetes.podCIDR: 10.244.0.1/16 has host bits set (the range is 10.244.0.0/16)",
			"node.yaml:6: kubernetes.serviceCIDR: 10.0.0.0/8 is too large (at most /12)",
			`node.yaml:7: kubernetes.clusterDNS: "ten" is not an IP address`,
			`node.yaml:8: kubernetes.clusterDomain: "Cluster.Local" is not an RFC 1123 DNS name`,
			`node.yaml:10: kubernetes.nodeLabels["node-role.kubernetes.io/worker"]: a kubelet may not set labels in the kubernetes.io and k8s.io namespaces`,
			`node.yaml:11: kubernetes.nodeLabels["bad key"]: "bad key" is not a label key`,
			`node.yaml:13: kubernetes.kubeletExtraArgs["--max-pods"]: write the flag name without leading dashes (max-pods)`}},
		{"leader election", "cluster: {name: prod, dnsZone: example.com}\nrole: control-plane\netcd: {member: a, members: [a]}\nkubernetes:\n  leaderElection:\n    leaseDuration: 10s\n    renewDeadline: 2s\n    retryPeriod: soon\n", []string{
			`node.yaml:8: kubernetes.leaderElection.retryPeriod: "soon" is not a positive duration like 15s`}},
		{"preflight ignore", "cluster: {name: prod, dnsZone: example.com}\nrole: control-plane\netcd: {member: a, members: [a]}\npreflight:\n  ignore:\n    - cpus\n    - Memory\n", []string{
			`node.yaml:7: preflight.ignore[1]: "Memory" is not a check name (cpus, memory, swap, port-6443, …, or all)`}},
		{"etcd timings", "cluster: {name: prod, dnsZone: example.com}\nrole: control-plane\netcd:\n  member: a\n  members: [a]\n  heartbeatInterval: 0.5ms\n  electionTimeout: 5s\n", []string{
			`node.yaml:6: etcd.heartbeatInterval: "0.5ms" is not a duration of whole milliseconds like 500ms`}},
		{"etcd election shorter than 5 heartbeats", "cluster: {name: prod, dnsZone: example.com}\nrole: control-plane\netcd:\n  member: a\n  members: [a]\n  heartbeatInterval: 500ms\n  electionTimeout: 2s\n", []string{
			"node.yaml:7: etcd.electionTimeout: 2s must be at least 5 × heartbeatInterval (500ms)"}},
		{"etcd election too long", "cluster: {name: prod, dnsZone: example.com}\nrole: control-plane\netcd:\n  member: a\n  members: [a]\n  electionTimeout: 1m\n", []string{
			"node.yaml:6: etcd.electionTimeout: 1m0s is longer than etcd takes (50s)"}},
		{"leader election order", "cluster: {name: prod, dnsZone: example.com}\nrole: control-plane\netcd: {member: a, members: [a]}\nkubernetes:\n  leaderElection:\n    leaseDuration: 10s\n    renewDeadline: 20s\n    retryPeriod: 18s\n", []string{
			"node.yaml:6: kubernetes.leaderElection.leaseDuration: 10s must be longer than renewDeadline (20s)",
			"node.yaml:7: kubernetes.leaderElection.renewDeadline: 20s must be longer than 1.2 × retryPeriod (18s)"}},
		{"overlapping ranges", "cluster: {name: prod, dnsZone: example.com}\nrole: worker\nkubernetes:\n  podCIDR: 10.96.0.0/16\n", []string{
			"node.yaml:3: kubernetes.serviceCIDR: 10.96.0.0/12 overlaps podCIDR 10.96.0.0/16"}},
		{"dual stack of one family", "cluster: {name: prod, dnsZone: example.com}\nrole: worker\nkubernetes:\n  podCIDR: 10.244.0.0/16,10.245.0.0/16\n", []string{
			`node.yaml:4: kubernetes.podCIDR: "10.244.0.0/16,10.245.0.0/16": a dual-stack pair is one IPv4 and one IPv6 range`}},
	}
}

// A control plane of the external topology names the etcd nodes' members and runs none: no
// member, seed or volume is filled in for it.
func TestParseNodeExternalEtcd(t *testing.T) {
	n, err := ParseNode([]byte("cluster: {name: prod, dnsZone: example.com}\nrole: control-plane\netcd: {external: true, members: [a, b, c]}\n"), "node.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if e := n.Etcd; !e.External || e.Member != "" || e.Seed != "" || e.Volume != nil || !slices.Equal(e.Members, []string{"a", "b", "c"}) {
		t.Errorf("etcd = %+v", e)
	}
}
