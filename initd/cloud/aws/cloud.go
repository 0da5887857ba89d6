// Package aws is kiln-init's AWS: the IMDSv2 config source, the instance's identity from
// IMDS, the EBS finder of the etcd volume and Route 53 for the node's names, behind
// cloud.Cloud. It speaks to AWS with small clients of its own rather than the AWS SDK's
// generated ones (tens of MB for a few calls): IMDSv2, the instance role's credentials
// from IMDS, SigV4 signing, and the EC2 Query and Route 53 REST-XML calls it makes, at
// node.yaml's endpoints.
package aws

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/kilnproject/kiln/initd/cloud"
	"github.com/kilnproject/kiln/initd/config"
	"github.com/kilnproject/kiln/initd/dns"
	"github.com/kilnproject/kiln/initd/etcdvolume"
	"github.com/kilnproject/kiln/initd/source"
)

// Cloud is AWS, as a cloud.Cloud.
type Cloud struct{}

var _ cloud.Cloud = Cloud{}

// identityTimeout bounds the reads of the instance's identity from IMDS.
const identityTimeout = time.Minute

// Name implements cloud.Cloud.
func (Cloud) Name() string { return "aws" }

// Source implements cloud.Cloud: IMDSv2's user data.
func (Cloud) Source() source.Provider { return &IMDS{} }

// Identify implements cloud.Cloud: the instance's identity from IMDSv2 at n's
// aws.endpoints.imds (the default without one).
func (Cloud) Identify(ctx context.Context, n *config.Node) (cloud.Instance, error) {
	ctx, cancel := context.WithTimeout(ctx, identityTimeout)
	defer cancel()
	var endpoint string
	if n != nil {
		endpoint = n.AWS.Endpoints.IMDS
	}
	return readInstance(ctx, endpoint)
}

// SelectsVolume implements cloud.Cloud: etcd.volume.awsTags.
func (Cloud) SelectsVolume(v *config.Volume) bool { return len(v.AWSTags) > 0 }

// EtcdVolume implements cloud.Cloud: the EBS volume selected by tags, found and attached
// through EC2 with the instance's role credentials, in the instance's zone.
func (Cloud) EtcdVolume(ctx context.Context, n *config.Node, v *config.Volume, in cloud.Instance, log *slog.Logger) (etcdvolume.Finder, error) {
	s, err := newAPISession(ctx, n)
	if err != nil {
		return nil, err
	}
	client, err := s.ec2Client()
	if err != nil {
		return nil, err
	}
	return EBS{Client: client, InstanceID: in.InstanceID, AZ: in.Zone, Cluster: n.Cluster.Name,
		EtcdCluster: n.AWS.EtcdCluster, Member: n.Etcd.Member, Tags: v.AWSTags, MountPath: v.MountPath,
		Log: log}, nil
}

// DNS implements cloud.Cloud: Route 53 for dns.provider route53.
func (Cloud) DNS(ctx context.Context, n *config.Node) (dns.Provider, error) {
	if n.DNS.Provider != config.DNSRoute53 {
		return nil, nil
	}
	s, err := newAPISession(ctx, n)
	if err != nil {
		return nil, fmt.Errorf("route53: %w", err)
	}
	client, err := s.route53Client()
	if err != nil {
		return nil, fmt.Errorf("route53: %w", err)
	}
	return route53Provider(n, client), nil
}

// route53Provider is the Route 53 provider of n: the hosted zone aws.route53HostedZoneId,
// else the one named dns.zone.
func route53Provider(n *config.Node, client Route53API) *Route53 {
	return &Route53{Client: client, Zone: n.DNS.Zone, HostedZoneID: n.AWS.Route53HostedZoneID}
}
