package firstboot

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"cloud.google.com/go/compute/metadata"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/route53"
	"golang.org/x/oauth2"
	compute "google.golang.org/api/compute/v1"
	gdns "google.golang.org/api/dns/v1"
	"google.golang.org/api/option"

	"github.com/kilnproject/kiln/initd/config"
	"github.com/kilnproject/kiln/initd/source"
)

// The node's cloud API clients. Credentials come from the instance, as each SDK's default
// chain finds them there: on EC2 the instance role's, from IMDS; on GCE the default service
// account's token, from the metadata server. node.yaml's aws.endpoints and gce.endpoints
// point the clients elsewhere (VPC or Private Service Connect endpoints).

// awsConfig is the SDK configuration for the node's AWS calls.
func awsConfig(ctx context.Context, n *config.Node) (aws.Config, error) {
	cfg, err := source.AWSConfig(ctx, n.AWS.Endpoints.IMDS)
	if err != nil {
		return aws.Config{}, fmt.Errorf("AWS config: %w", err)
	}
	return cfg, nil
}

// ec2Client is the EC2 client for the node's etcd volume.
func ec2Client(cfg aws.Config, n *config.Node) *ec2.Client {
	return ec2.NewFromConfig(cfg, func(o *ec2.Options) {
		if e := n.AWS.Endpoints.EC2; e != "" {
			o.BaseEndpoint = aws.String(e)
		}
	})
}

// route53Client is the Route 53 client for the node's names.
func route53Client(cfg aws.Config, n *config.Node) *route53.Client {
	return route53.NewFromConfig(cfg, func(o *route53.Options) {
		if e := n.AWS.Endpoints.Route53; e != "" {
			o.BaseEndpoint = aws.String(e)
		}
	})
}

// computeService is the Compute Engine client for the node's etcd disk.
func computeService(ctx context.Context, n *config.Node) (*compute.Service, error) {
	svc, err := compute.NewService(ctx, gceOptions(n.GCE.Endpoints.Compute)...)
	if err != nil {
		return nil, fmt.Errorf("compute API: %w", err)
	}
	return svc, nil
}

// cloudDNSService is the Cloud DNS client for the node's names.
func cloudDNSService(ctx context.Context, n *config.Node) (*gdns.Service, error) {
	svc, err := gdns.NewService(ctx, gceOptions(n.GCE.Endpoints.DNS)...)
	if err != nil {
		return nil, fmt.Errorf("cloud DNS API: %w", err)
	}
	return svc, nil
}

func gceOptions(endpoint string) []option.ClientOption {
	opts := []option.ClientOption{option.WithTokenSource(oauth2.ReuseTokenSource(nil, metadataToken{source.GCEMetadataClient()}))}
	if endpoint != "" {
		opts = append(opts, option.WithEndpoint(endpoint))
	}
	return opts
}

// metadataToken is the instance's default service account's access token, from the GCE
// metadata server (through the capped client source.GCEMetadataClient gives).
type metadataToken struct{ md *metadata.Client }

// tokenTimeout bounds one token request.
const tokenTimeout = 30 * time.Second

// Token implements oauth2.TokenSource.
func (m metadataToken) Token() (*oauth2.Token, error) {
	ctx, cancel := context.WithTimeout(context.Background(), tokenTimeout)
	defer cancel()
	const path = "instance/service-accounts/default/token"
	body, err := m.md.GetWithContext(ctx, path)
	if err != nil {
		return nil, fmt.Errorf("GCE metadata %s: %w", path, err)
	}
	var t struct {
		AccessToken string `json:"access_token"`
		ExpiresIn   int64  `json:"expires_in"`
		TokenType   string `json:"token_type"`
	}
	if err := json.Unmarshal([]byte(body), &t); err != nil {
		return nil, fmt.Errorf("GCE metadata %s: %w", path, err)
	}
	if t.AccessToken == "" {
		return nil, fmt.Errorf("GCE metadata %s: no access_token in the answer", path)
	}
	return &oauth2.Token{AccessToken: t.AccessToken, TokenType: t.TokenType,
		Expiry: time.Now().Add(time.Duration(t.ExpiresIn) * time.Second)}, nil
}
