package pki

import (
	"bytes"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"time"
)

// Names of the CAs in a kubeadm PKI directory.
const (
	CAName           = "ca"             // CN kubernetes
	FrontProxyCAName = "front-proxy-ca" // CN front-proxy-ca
	EtcdCAName       = "etcd/ca"        // CN etcd-ca
	ServiceAccount   = "sa"             // sa.key + sa.pub
)

// Common names of the CAs, as kubeadm names them.
const (
	CACommonName           = "kubernetes"
	FrontProxyCACommonName = "front-proxy-ca"
	EtcdCACommonName       = "etcd-ca"
)

// Group names in certificate subjects.
const (
	GroupClusterAdmins = "kubeadm:cluster-admins" // bound to cluster-admin by a ClusterRoleBinding kubeadm:cluster-admins
	groupMasters       = "system:masters"         // super-user, bypasses RBAC
	groupNodes         = "system:nodes"
)

// Defaults applied to an empty Node field.
const (
	defaultServiceCIDR   = "10.96.0.0/12"
	defaultClusterDomain = "cluster.local"
)

// Node is what a control-plane node's certificates are made for.
type Node struct {
	Hostname string   // the node name: CN of etcd/server and etcd/peer, a SAN of every server cert
	IPs      []net.IP // the node's addresses: SANs of apiserver, etcd/server and etcd/peer
	// APIServerSANs are extra names (or IP literals) of the API server: the apiEndpoint
	// host and api.internal.<cluster>.<zone>.
	APIServerSANs []string
	// EtcdSANs are extra names (or IP literals) of this etcd member, e.g.
	// etcd-<member>.internal.<cluster>.<zone>.
	EtcdSANs      []string
	ServiceCIDR   string // default 10.96.0.0/12; "v4,v6" for dual stack; the first IP of each is an apiserver SAN
	ClusterDomain string // default cluster.local
	// ExternalEtcd: the control plane runs no etcd member (its etcd runs on etcd nodes),
	// so it has no etcd/server, etcd/peer or etcd/healthcheck-client.
	ExternalEtcd bool
}

// leaf is one certificate of the certs phase.
type leaf struct {
	name string // path below the PKI dir, without extension
	ca   string // CA name below the PKI dir
	cert Cert
}

// controlPlaneLeafNames lists the leaf certificates ControlPlaneCerts manages, in the
// order it makes them.
var controlPlaneLeafNames = []string{
	"apiserver", "apiserver-kubelet-client", "front-proxy-client",
	"etcd/server", "etcd/peer", "etcd/healthcheck-client", "apiserver-etcd-client",
}

// controlPlaneLeaves describes kubeadm's leaf certificates for n.
func controlPlaneLeaves(n Node) ([]leaf, error) {
	if n.Hostname == "" {
		return nil, errors.New("node hostname is empty")
	}
	svcCIDR := n.ServiceCIDR
	if svcCIDR == "" {
		svcCIDR = defaultServiceCIDR
	}
	domain := strings.TrimSuffix(n.ClusterDomain, ".")
	if domain == "" {
		domain = defaultClusterDomain
	}
	var svcIPs []net.IP
	for _, s := range strings.Split(svcCIDR, ",") {
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil {
			return nil, fmt.Errorf("service CIDR %q: %w", s, err)
		}
		// The first address of the range is the kubernetes Service's cluster IP.
		svcIPs = append(svcIPs, net.IP(p.Masked().Addr().Next().AsSlice()))
	}

	apiDNS, apiIPs := splitNames(n.APIServerSANs)
	apiserver := Cert{
		CommonName: "kube-apiserver",
		DNSNames: append([]string{n.Hostname, "kubernetes", "kubernetes.default", "kubernetes.default.svc",
			"kubernetes.default.svc." + domain, "localhost"}, apiDNS...),
		IPs:    slices.Concat(svcIPs, n.IPs, []net.IP{net.IPv4(127, 0, 0, 1)}, apiIPs),
		Server: true,
	}
	etcdDNS, etcdIPs := splitNames(n.EtcdSANs)
	etcdNames := append([]string{n.Hostname, "localhost"}, etcdDNS...)
	etcdAddrs := slices.Concat(n.IPs, []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}, etcdIPs)
	etcd := Cert{CommonName: n.Hostname, DNSNames: etcdNames, IPs: etcdAddrs, Server: true, Client: true}

	leaves := []leaf{
		{"apiserver", CAName, apiserver},
		{"apiserver-kubelet-client", CAName, Cert{CommonName: "kube-apiserver-kubelet-client", Organization: []string{GroupClusterAdmins}, Client: true}},
		{"front-proxy-client", FrontProxyCAName, Cert{CommonName: "front-proxy-client", Client: true}},
		{"etcd/server", EtcdCAName, etcd},
		{"etcd/peer", EtcdCAName, etcd},
		{"etcd/healthcheck-client", EtcdCAName, Cert{CommonName: "kube-etcd-healthcheck-client", Client: true}},
		{"apiserver-etcd-client", EtcdCAName, Cert{CommonName: "kube-apiserver-etcd-client", Client: true}},
	}
	for i := range leaves {
		leaves[i].cert = normalize(leaves[i].cert)
	}
	return leaves, nil
}

// splitNames separates IP literals from DNS names.
func splitNames(names []string) (dns []string, ips []net.IP) {
	for _, s := range names {
		s = strings.TrimSuffix(strings.Trim(s, "[]"), ".")
		if s == "" {
			continue
		}
		if ip := net.ParseIP(s); ip != nil {
			ips = append(ips, ip)
		} else {
			dns = append(dns, strings.ToLower(s))
		}
	}
	return dns, ips
}

// normalize sorts and de-duplicates c's names so that two descriptions of the same
// certificate compare equal.
func normalize(c Cert) Cert {
	c.DNSNames = slices.Compact(slices.Sorted(slices.Values(c.DNSNames)))
	c.Organization = slices.Compact(slices.Sorted(slices.Values(c.Organization)))
	ips := make([]net.IP, 0, len(c.IPs))
	for _, ip := range c.IPs {
		if v4 := ip.To4(); v4 != nil {
			ip = v4
		}
		ips = append(ips, ip)
	}
	slices.SortFunc(ips, func(a, b net.IP) int { return bytes.Compare(a.To16(), b.To16()) })
	c.IPs = slices.CompactFunc(ips, func(a, b net.IP) bool { return a.Equal(b) })
	return c
}

// describe is the Cert a certificate was issued as.
func describe(x *x509.Certificate) Cert {
	c := Cert{
		CommonName:   x.Subject.CommonName,
		Organization: x.Subject.Organization,
		DNSNames:     x.DNSNames,
		IPs:          x.IPAddresses,
		Server:       slices.Contains(x.ExtKeyUsage, x509.ExtKeyUsageServerAuth),
		Client:       slices.Contains(x.ExtKeyUsage, x509.ExtKeyUsageClientAuth),
	}
	return normalize(c)
}

func sameCert(a, b Cert) bool {
	return a.CommonName == b.CommonName && a.Server == b.Server && a.Client == b.Client &&
		slices.Equal(a.Organization, b.Organization) && slices.Equal(a.DNSNames, b.DNSNames) &&
		slices.EqualFunc(a.IPs, b.IPs, net.IP.Equal)
}

// CheckLeaf reports why the certificate pair certPEM/keyPEM is not a valid, current
// issue of want by ca at now, or nil when it is: it must chain to ca, have more than
// renewBefore left, carry want's subject, names and usages, and the key must match.
func CheckLeaf(ca *CA, kp KeyPair, want Cert, now time.Time) error {
	cert, err := ParseCertPEM(kp.CertPEM)
	if err != nil {
		return err
	}
	key, err := parseKeyPEM(kp.KeyPEM)
	if err != nil {
		return err
	}
	if !keyMatches(cert, key) {
		return errors.New("the key does not match the certificate")
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return fmt.Errorf("not valid under CA %q: %w", ca.Cert.Subject.CommonName, err)
	}
	if left := cert.NotAfter.Sub(now); left < renewBefore {
		return fmt.Errorf("expires %s, in less than %s", cert.NotAfter.Format(time.RFC3339), renewBefore)
	}
	if got, want := describe(cert), normalize(want); !sameCert(got, want) {
		return fmt.Errorf("subject or names differ: have %s, want %s", summary(got), summary(want))
	}
	return nil
}

func summary(c Cert) string {
	ips := make([]string, len(c.IPs))
	for i, ip := range c.IPs {
		ips[i] = ip.String()
	}
	return fmt.Sprintf("CN=%s O=%v DNS=%v IP=%v server=%t client=%t", c.CommonName, c.Organization, c.DNSNames, ips, c.Server, c.Client)
}

// ControlPlaneCerts is kubeadm's certs phase for one control-plane node. The CAs (ca,
// front-proxy-ca, etcd/ca, see LoadCA) must be in pkiDir; the leaf certificates
// apiserver, apiserver-kubelet-client, front-proxy-client, etcd/server, etcd/peer,
// etcd/healthcheck-client and apiserver-etcd-client are written there (without the three
// etcd member ones when n.ExternalEtcd). A leaf that is still valid (CheckLeaf) is kept;
// the others are (re-)issued. It returns the names it wrote, in controlPlaneLeafNames order.
func ControlPlaneCerts(pkiDir string, n Node, now time.Time) (changed []string, err error) {
	leaves, err := controlPlaneLeaves(n)
	if err != nil {
		return nil, fmt.Errorf("control-plane certificates: %w", err)
	}
	if n.ExternalEtcd {
		leaves = slices.DeleteFunc(leaves, func(l leaf) bool { return slices.Contains(etcdMemberLeafNames, l.name) })
	}
	return issueLeaves(pkiDir, leaves, []string{CAName, FrontProxyCAName, EtcdCAName}, now)
}

// etcdMemberLeafNames are the certificates of a node that runs an etcd member.
var etcdMemberLeafNames = []string{"etcd/server", "etcd/peer", "etcd/healthcheck-client"}

// EtcdCerts is the certs phase of a dedicated etcd node (kubeadm's external etcd layout):
// etcd/server, etcd/peer and etcd/healthcheck-client, issued by the etcd CA (etcd/ca in
// pkiDir), whose names and addresses are n's as on a control plane. It keeps valid leaves
// and returns the names it wrote, as ControlPlaneCerts does.
func EtcdCerts(pkiDir string, n Node, now time.Time) (changed []string, err error) {
	leaves, err := controlPlaneLeaves(n)
	if err != nil {
		return nil, fmt.Errorf("etcd certificates: %w", err)
	}
	leaves = slices.DeleteFunc(leaves, func(l leaf) bool { return !slices.Contains(etcdMemberLeafNames, l.name) })
	return issueLeaves(pkiDir, leaves, []string{EtcdCAName}, now)
}

// issueLeaves loads the CAs named cas from pkiDir and writes each leaf that is not a
// valid issue already; it returns the names it wrote, in order.
func issueLeaves(pkiDir string, leaves []leaf, cas []string, now time.Time) (changed []string, err error) {
	loaded := map[string]*CA{}
	for _, name := range cas {
		if loaded[name], err = LoadCA(pkiDir, name); err != nil {
			return nil, err
		}
	}
	for _, l := range leaves {
		ca := loaded[l.ca]
		if kp, err := ReadKeyPair(pkiDir, l.name); err == nil {
			if CheckLeaf(ca, kp, l.cert, now) == nil {
				continue
			}
		} else if !errors.Is(err, os.ErrNotExist) {
			return changed, fmt.Errorf("certificate %s: %w", l.name, err)
		}
		kp, err := ca.Issue(l.cert, now)
		if err != nil {
			return changed, fmt.Errorf("certificate %s: %w", l.name, err)
		}
		if err := WriteKeyPair(pkiDir, l.name, kp); err != nil {
			return changed, err
		}
		changed = append(changed, l.name)
	}
	return changed, nil
}
