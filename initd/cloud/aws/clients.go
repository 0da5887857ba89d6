package aws

import (
	"context"
	"fmt"

	sdkaws "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/route53"

	"github.com/kilnproject/kiln/initd/config"
)

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
