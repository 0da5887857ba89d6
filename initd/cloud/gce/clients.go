package gce

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"cloud.google.com/go/compute/metadata"
	"golang.org/x/oauth2"
	compute "google.golang.org/api/compute/v1"
	gdns "google.golang.org/api/dns/v1"
	"google.golang.org/api/option"

	"github.com/kilnproject/kiln/initd/config"
)

// The node's GCE API clients. Credentials come from the instance: the default service
// account's token, from the metadata server. node.yaml's gce.endpoints point the clients
// elsewhere (Private Service Connect endpoints).

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
	opts := []option.ClientOption{option.WithTokenSource(oauth2.ReuseTokenSource(nil, metadataToken{MetadataClient()}))}
	if endpoint != "" {
		opts = append(opts, option.WithEndpoint(endpoint))
	}
	return opts
}

// metadataToken is the instance's default service account's access token, from the GCE
// metadata server (through the capped client MetadataClient gives).
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
