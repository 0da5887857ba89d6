package config

import (
	"reflect"
	"strings"
	"testing"
)

const awsNode = `cluster: {name: prod, dnsZone: example.com}
role: control-plane
dns: {provider: route53}
etcd:
  member: b
  members: [a, b, c]
  volume:
    awsTags: {kubernetes.io/cluster/prod: owned}
aws:
  etcdCluster: events
  route53HostedZoneId: Z0KILN12345
  endpoints:
    ec2: https://vpce-0123.ec2.eu-west-1.vpce.amazonaws.com
    route53: http://169.254.169.254:8053
    imds: http://[fd00:ec2::254]
`

const gceNode = `cluster: {name: prod, dnsZone: example.com}
role: etcd
dns: {provider: rfc2136, server: 10.0.0.53, tsigKeyName: kiln., tsigSecretFile: /etc/kiln/tsig.key, tsigAlgorithm: HMAC-SHA512}
etcd:
  member: a
  members: [a]
  volume:
    gceLabels: {k8s-io-etcd-main: a, kubernetes-io-cluster-prod: ""}
gce:
  endpoints:
    compute: https://compute-kiln.p.googleapis.com/compute/v1/
    dns: http://127.0.0.1:8080/
`

// The aws and gce blocks and dns.tsigAlgorithm are read as written, with the etcd cluster
// name defaulting to main and the algorithm lower-cased.
func TestParseNodeClouds(t *testing.T) {
	n, err := ParseNode([]byte(awsNode), "node.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want := AWS{EtcdCluster: "events", Route53HostedZoneID: "Z0KILN12345", Endpoints: AWSEndpoints{
		EC2: "https://vpce-0123.ec2.eu-west-1.vpce.amazonaws.com", Route53: "http://169.254.169.254:8053", IMDS: "http://[fd00:ec2::254]"}}
	if !reflect.DeepEqual(n.AWS, want) {
		t.Errorf("aws = %+v, want %+v", n.AWS, want)
	}
	n, err = ParseNode([]byte(gceNode), "node.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if n.AWS.EtcdCluster != DefaultEtcdCluster || n.DNS.TSIGAlgorithm != "hmac-sha512" ||
		n.GCE.Endpoints.DNS != "http://127.0.0.1:8080/" || len(n.Etcd.Volume.GCELabels) != 2 {
		t.Errorf("unexpected node %+v", n)
	}
}

func TestParseNodeCloudErrors(t *testing.T) {
	tests := []nodeErrorCase{
		{"aws", "cluster: {name: prod, dnsZone: example.com}\nrole: worker\ndns: {provider: hosts}\naws:\n  etcdCluster: Main\n  route53HostedZoneId: zone-1\n  endpoints:\n    ec2: ftp://ec2.example.com\n    route53: http://route53.example.com\n    imds: 169.254.169.254\n    s3: https://s3.example.com\n", []string{
			`node.yaml:11: aws.endpoints.s3: unknown field (known: ec2, imds, route53)`}},
		{"aws values", "cluster: {name: prod, dnsZone: example.com}\nrole: worker\ndns: {provider: hosts}\naws:\n  etcdCluster: Main\n  route53HostedZoneId: Z1\n  endpoints:\n    ec2: ftp://ec2.example.com\n    route53: http://route53.example.com\n    imds: 169.254.169.254\n", []string{
			`node.yaml:5: aws.etcdCluster: "Main" is not an RFC 1123 label (the <name> of the tag key k8s.io/etcd/<name>)`,
			`node.yaml:6: aws.route53HostedZoneId: is only used with dns.provider route53 (provider is hosts)`,
			`node.yaml:8: aws.endpoints.ec2: "ftp://ec2.example.com": the scheme must be https`,
			`node.yaml:9: aws.endpoints.route53: "http://route53.example.com": http only to a loopback or link-local address (credentials would cross the network in the clear); use https`,
			`node.yaml:10: aws.endpoints.imds: "169.254.169.254" is not an endpoint URL like https://host[:port][/path]`}},
		{"gce", "cluster: {name: prod, dnsZone: example.com}\nrole: etcd\netcd:\n  member: a\n  members: [a]\n  volume:\n    gceName: etcd-a\n    gceLabels: {Role: etcd, member: A}\ngce:\n  endpoints: {compute: \"https://user@compute.example.com/\"}\n", []string{
			"node.yaml:6: etcd.volume: set exactly one of serial, byId, awsTags, gceName and gceLabels (2 are set)",
			`node.yaml:8: etcd.volume.gceLabels["Role"]: "Role" is not a GCE label key (lower-case letter first, then lower-case letters, digits, '_' and '-', at most 63)`,
			`node.yaml:8: etcd.volume.gceLabels["member"]: "A" is not a GCE label value (lower-case letters, digits, '_' and '-', at most 63)`,
			`node.yaml:10: gce.endpoints.compute: "https://user@compute.example.com/" is not an endpoint URL like https://host[:port][/path]`}},
		{"tsig algorithm", "cluster: {name: prod, dnsZone: example.com}\nrole: worker\ndns:\n  provider: rfc2136\n  server: 10.0.0.53\n  tsigAlgorithm: hmac-md5\n", []string{
			`node.yaml:6: dns.tsigAlgorithm: "hmac-md5" is not one of hmac-sha1, hmac-sha224, hmac-sha256, hmac-sha384, hmac-sha512`}},
		{"tsig algorithm without a key", "cluster: {name: prod, dnsZone: example.com}\nrole: worker\ndns:\n  provider: rfc2136\n  server: 10.0.0.53\n  tsigAlgorithm: hmac-sha1\n", []string{
			`node.yaml:6: dns.tsigAlgorithm: is only used with dns.tsigKeyName`}},
		{"tsig algorithm with route53", "cluster: {name: prod, dnsZone: example.com}\nrole: worker\ndns:\n  provider: route53\n  tsigAlgorithm: hmac-sha1\n", []string{
			`node.yaml:5: dns.tsigAlgorithm: is only used with dns.provider rfc2136 (provider is route53)`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseNode([]byte(tc.doc), "node.yaml")
			if err == nil {
				t.Fatal("ParseNode accepted it")
			}
			got := strings.Split(err.Error(), "\n")
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("errors:\n%s\nwant:\n%s", err, strings.Join(tc.want, "\n"))
			}
		})
	}
}
