package config

import (
	"fmt"
	"maps"
	"net/netip"
	"net/url"
	"regexp"
	"slices"
	"strings"

	"github.com/kilnproject/kiln/internal/strictyaml"
)

// AWS is what a node on EC2 is told beyond what the instance metadata service says.
type AWS struct {
	// EtcdCluster is <name> in the tag key k8s.io/etcd/<name> that marks the etcd volumes
	// (etcd.volume.awsTags); DefaultEtcdCluster when not set.
	EtcdCluster string `yaml:"etcdCluster"`
	// Route53HostedZoneID is the hosted zone the names go to (dns.provider route53); when
	// empty the one hosted zone named dns.zone is looked up.
	Route53HostedZoneID string       `yaml:"route53HostedZoneId"`
	Endpoints           AWSEndpoints `yaml:"endpoints"`
}

// AWSEndpoints override the API endpoints the node calls (VPC interface endpoints, tests);
// empty means the SDK's own.
type AWSEndpoints struct {
	EC2     string `yaml:"ec2"`
	Route53 string `yaml:"route53"`
	// IMDS is the instance metadata service the node's API credentials, region and
	// identity come from. The config itself is always read from the standard address.
	IMDS string `yaml:"imds"`
}

// GCE is what a node on Google Compute Engine is told beyond what the metadata server says.
type GCE struct {
	Endpoints GCEEndpoints `yaml:"endpoints"`
}

// GCEEndpoints override the API base URLs the node calls (Private Service Connect, tests),
// as the Google API clients take them; empty means the client's own.
type GCEEndpoints struct {
	Compute string `yaml:"compute"` // e.g. https://compute.googleapis.com/compute/v1/
	DNS     string `yaml:"dns"`     // e.g. https://dns.googleapis.com/
}

// DefaultEtcdCluster is the etcd cluster name in the k8s.io/etcd/<name> volume tag when
// aws.etcdCluster is not set: kOps names its main cluster so.
const DefaultEtcdCluster = "main"

// TSIGAlgorithms are the values dns.tsigAlgorithm takes.
var TSIGAlgorithms = []string{"hmac-sha1", "hmac-sha224", "hmac-sha256", "hmac-sha384", "hmac-sha512"}

var (
	hostedZoneID = regexp.MustCompile(`^(/hostedzone/)?Z[A-Z0-9]{1,31}$`)
	gceLabelKey  = regexp.MustCompile(`^[a-z][a-z0-9_-]{0,62}$`)
	gceLabelVal  = regexp.MustCompile(`^[a-z0-9_-]{0,63}$`)
)

// checkClouds validates the aws and gce blocks and dns.tsigAlgorithm, filling in defaults.
func (n *Node) checkClouds(d *strictyaml.Doc) {
	a := &n.AWS
	if a.EtcdCluster == "" {
		a.EtcdCluster = DefaultEtcdCluster
	} else if !isDNSLabel(a.EtcdCluster) {
		d.Failf("aws.etcdCluster", "%q is not an RFC 1123 label (the <name> of the tag key k8s.io/etcd/<name>)", a.EtcdCluster)
	}
	if id := a.Route53HostedZoneID; id != "" {
		switch {
		case !hostedZoneID.MatchString(id):
			d.Failf("aws.route53HostedZoneId", "%q is not a hosted zone ID like Z0123456789ABCDEFGHIJ", id)
		case n.DNS.Provider != DNSRoute53:
			d.Failf("aws.route53HostedZoneId", "is only used with dns.provider route53 (provider is %s)", n.DNS.Provider)
		}
	}
	for field, v := range map[string]string{"aws.endpoints.ec2": a.Endpoints.EC2, "aws.endpoints.route53": a.Endpoints.Route53,
		"aws.endpoints.imds": a.Endpoints.IMDS, "gce.endpoints.compute": n.GCE.Endpoints.Compute, "gce.endpoints.dns": n.GCE.Endpoints.DNS} {
		if err := checkEndpoint(v); err != nil {
			d.Failf(field, "%v", err)
		}
	}
	if alg := strings.ToLower(strings.TrimSuffix(n.DNS.TSIGAlgorithm, ".")); alg != "" {
		switch {
		case !slices.Contains(TSIGAlgorithms, alg):
			d.Failf("dns.tsigAlgorithm", "%q is not one of %s", n.DNS.TSIGAlgorithm, strings.Join(TSIGAlgorithms, ", "))
		case n.DNS.Provider == DNSRFC2136 && n.DNS.TSIGKeyName == "":
			d.Failf("dns.tsigAlgorithm", "is only used with dns.tsigKeyName")
		}
		n.DNS.TSIGAlgorithm = alg
	}
}

// imdsIPv6 is the EC2 instance metadata service's IPv6 address, on the instance's own link.
var imdsIPv6 = netip.MustParseAddr("fd00:ec2::254")

// checkEndpoint accepts an API endpoint: an https URL, or an http one whose host is a
// loopback or link-local address or fd00:ec2::254 (a test, or a service on the metadata
// network), since plain http would carry the node's credentials in the clear.
func checkEndpoint(s string) error {
	if s == "" {
		return nil
	}
	u, err := url.Parse(s)
	if err != nil || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("%q is not an endpoint URL like https://host[:port][/path]", s)
	}
	switch u.Scheme {
	case "https":
		return nil
	case "http":
		if a, err := netip.ParseAddr(u.Hostname()); err == nil && (a.IsLoopback() || a.IsLinkLocalUnicast() || a == imdsIPv6) {
			return nil
		}
		return fmt.Errorf("%q: http only to a loopback or link-local address (credentials would cross the network in the clear); use https", s)
	}
	return fmt.Errorf("%q: the scheme must be https", s)
}

// checkGCELabels validates etcd.volume.gceLabels: GCE label keys and values.
func checkGCELabels(d *strictyaml.Doc, labels map[string]string) {
	for _, k := range slices.Sorted(maps.Keys(labels)) { // one order of findings, every run
		v := labels[k]
		field := strictyaml.MapKey("etcd.volume.gceLabels", k)
		switch {
		case !gceLabelKey.MatchString(k):
			d.Failf(field, "%q is not a GCE label key (lower-case letter first, then lower-case letters, digits, '_' and '-', at most 63)", k)
		case !gceLabelVal.MatchString(v):
			d.Failf(field, "%q is not a GCE label value (lower-case letters, digits, '_' and '-', at most 63)", v)
		}
	}
}
