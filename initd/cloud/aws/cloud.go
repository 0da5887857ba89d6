// Package aws is kiln-init's AWS: the IMDSv2 config source, the instance's identity from
// IMDS, the SDK clients with node.yaml's endpoints, the EBS finder of the etcd volume and
// Route 53 for the node's names, behind cloud.Cloud.
package aws

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"

	sdkaws "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/ec2/imds"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/route53"

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

// readInstance reads the instance's identity from IMDSv2 at endpoint ("" the default).
// The hostname is the first label of EC2's local-hostname.
func readInstance(ctx context.Context, endpoint string) (cloud.Instance, error) {
	md := imds.New(imds.Options{Endpoint: endpoint, HTTPClient: CapIMDS(nil), EnableFallback: sdkaws.FalseTernary})
	get := func(path string, optional bool) (string, error) {
		out, err := md.GetMetadata(ctx, &imds.GetMetadataInput{Path: path})
		if err != nil {
			var se interface{ HTTPStatusCode() int }
			if optional && errors.As(err, &se) && se.HTTPStatusCode() == http.StatusNotFound {
				return "", nil
			}
			return "", fmt.Errorf("instance identity: IMDS %s: %w", path, err)
		}
		defer out.Content.Close()
		b, err := io.ReadAll(out.Content)
		if err != nil {
			return "", fmt.Errorf("instance identity: IMDS %s: %w", path, err)
		}
		return strings.TrimSpace(string(b)), nil
	}
	in := cloud.Instance{Cloud: "aws"}
	var err error
	if in.InstanceID, err = get("instance-id", false); err != nil {
		return in, err
	}
	if in.Zone, err = get("placement/availability-zone", false); err != nil {
		return in, err
	}
	// An instance whose hostname type is resource name, or one in an IPv6-only subnet,
	// may have no local-hostname.
	host, err := get("local-hostname", true)
	in.Hostname = cloud.FirstLabel(host)
	return in, err
}

// SelectsVolume implements cloud.Cloud: etcd.volume.awsTags.
func (Cloud) SelectsVolume(v *config.Volume) bool { return len(v.AWSTags) > 0 }

// EtcdVolume implements cloud.Cloud: the EBS volume selected by tags, found and attached
// through EC2 with the instance's role credentials, in the instance's zone.
func (Cloud) EtcdVolume(ctx context.Context, n *config.Node, v *config.Volume, in cloud.Instance, log *slog.Logger) (etcdvolume.Finder, error) {
	cfg, err := awsConfig(ctx, n)
	if err != nil {
		return nil, err
	}
	return EBS{Client: ec2Client(cfg, n), InstanceID: in.InstanceID, AZ: in.Zone, Cluster: n.Cluster.Name,
		EtcdCluster: n.AWS.EtcdCluster, Member: n.Etcd.Member, Tags: v.AWSTags, MountPath: v.MountPath,
		Log: log}, nil
}

// DNS implements cloud.Cloud: Route 53 for dns.provider route53.
func (Cloud) DNS(ctx context.Context, n *config.Node) (dns.Provider, error) {
	if n.DNS.Provider != config.DNSRoute53 {
		return nil, nil
	}
	cfg, err := awsConfig(ctx, n)
	if err != nil {
		return nil, fmt.Errorf("route53: %w", err)
	}
	return route53Provider(n, route53Client(cfg, n)), nil
}

// The node's AWS API clients. Credentials come from the instance, as the SDK's default
// chain finds them there: the instance role's, from IMDS. node.yaml's aws.endpoints
// point the clients elsewhere (VPC endpoints).

// awsConfig is the SDK configuration for the node's AWS calls.
func awsConfig(ctx context.Context, n *config.Node) (sdkaws.Config, error) {
	cfg, err := Config(ctx, n.AWS.Endpoints.IMDS)
	if err != nil {
		return sdkaws.Config{}, fmt.Errorf("AWS config: %w", err)
	}
	return cfg, nil
}

// ec2Client is the EC2 client for the node's etcd volume.
func ec2Client(cfg sdkaws.Config, n *config.Node) *ec2.Client {
	return ec2.NewFromConfig(cfg, func(o *ec2.Options) {
		if e := n.AWS.Endpoints.EC2; e != "" {
			o.BaseEndpoint = sdkaws.String(e)
		}
	})
}

// route53Client is the Route 53 client for the node's names.
func route53Client(cfg sdkaws.Config, n *config.Node) *route53.Client {
	return route53.NewFromConfig(cfg, func(o *route53.Options) {
		if e := n.AWS.Endpoints.Route53; e != "" {
			o.BaseEndpoint = sdkaws.String(e)
		}
	})
}

// route53Provider is the Route 53 provider of n: the hosted zone aws.route53HostedZoneId,
// else the one named dns.zone.
func route53Provider(n *config.Node, client Route53API) *Route53 {
	return &Route53{Client: client, Zone: n.DNS.Zone, HostedZoneID: n.AWS.Route53HostedZoneID}
}
