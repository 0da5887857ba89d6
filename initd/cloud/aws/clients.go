package aws

import (
	"context"
	"fmt"

	"github.com/kilnproject/kiln/initd/config"
)

// The node's AWS API clients. Credentials and region come from the instance, through
// IMDS at node.yaml's aws.endpoints.imds: the instance role's credentials, and the
// region the instance runs in. node.yaml's aws.endpoints.ec2 and .route53 point the
// clients elsewhere (VPC endpoints); the default endpoints are the region's.

// apiSession is what the node's API clients share: the region, the instance role's
// credentials and node.yaml's endpoints.
type apiSession struct {
	region    string
	creds     credentialSource
	endpoints config.AWSEndpoints
}

// newAPISession reads the region from IMDS at n's aws.endpoints.imds (the default
// without one); the credentials are read when the first call needs them.
func newAPISession(ctx context.Context, n *config.Node) (*apiSession, error) {
	md := newIMDSClient(n.AWS.Endpoints.IMDS, nil)
	region, err := md.region(ctx)
	if err != nil {
		return nil, fmt.Errorf("AWS config: %w", err)
	}
	return &apiSession{region: region, creds: &roleCredentials{imds: md}, endpoints: n.AWS.Endpoints}, nil
}

// ec2Client is the EC2 client for the node's etcd volume, signing for the instance's region.
func (s *apiSession) ec2Client() (*EC2Client, error) {
	endpoint := s.endpoints.EC2
	if endpoint == "" {
		endpoint = ec2Endpoint(s.region)
	}
	return newEC2Client(endpoint, s.region, s.creds)
}

// route53Client is the Route 53 client for the node's names. Route 53 is a global
// service: requests are signed for its partition's region (us-east-1), also when
// node.yaml names another endpoint.
func (s *apiSession) route53Client() (*Route53Client, error) {
	endpoint, region := route53Endpoint(s.region)
	if s.endpoints.Route53 != "" {
		endpoint = s.endpoints.Route53
	}
	return newRoute53Client(endpoint, region, s.creds)
}
