// Package gce is kiln-init's Google Compute Engine: the metadata server's config
// source, the instance's identity from it, the default service account's token and the
// API clients with node.yaml's endpoints, the persistent-disk finder of the etcd volume
// and Cloud DNS for the node's names, behind cloud.Cloud.
package gce

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"cloud.google.com/go/compute/metadata"
	"golang.org/x/oauth2"
	compute "google.golang.org/api/compute/v1"
	gdns "google.golang.org/api/dns/v1"
	"google.golang.org/api/option"

	"github.com/kilnproject/kiln/initd/cloud"
	"github.com/kilnproject/kiln/initd/config"
	"github.com/kilnproject/kiln/initd/dns"
	"github.com/kilnproject/kiln/initd/etcdvolume"
	"github.com/kilnproject/kiln/initd/source"
)

// Cloud is GCE, as a cloud.Cloud.
type Cloud struct{}

var _ cloud.Cloud = Cloud{}

// identityTimeout bounds the reads of the instance's identity from the metadata server.
const identityTimeout = time.Minute

// Name implements cloud.Cloud.
func (Cloud) Name() string { return "gce" }

// Source implements cloud.Cloud: the metadata server's user-data attribute.
func (Cloud) Source() source.Provider { return &Metadata{} }

// Identify implements cloud.Cloud: the instance's identity from the metadata server.
func (Cloud) Identify(ctx context.Context, _ *config.Node) (cloud.Instance, error) {
	ctx, cancel := context.WithTimeout(ctx, identityTimeout)
	defer cancel()
	return readInstance(ctx, MetadataClient())
}

// readInstance reads the instance's identity from the GCE metadata server. The hostname
// is the first label of instance/hostname (cp-a.c.proj.internal → cp-a), else the
// instance name.
func readInstance(ctx context.Context, md *metadata.Client) (cloud.Instance, error) {
	in := cloud.Instance{Cloud: "gce"}
	var err error
	for _, f := range []struct {
		what string
		to   *string
		get  func(context.Context) (string, error)
	}{
		{"instance/id", &in.InstanceID, func(ctx context.Context) (string, error) { return md.GetWithContext(ctx, "instance/id") }},
		{"instance/name", &in.InstanceName, md.InstanceNameWithContext},
		{"instance/zone", &in.Zone, md.ZoneWithContext},
		{"project/project-id", &in.Project, md.ProjectIDWithContext},
		{"instance/hostname", &in.Hostname, md.HostnameWithContext},
	} {
		if *f.to, err = f.get(ctx); err != nil {
			return in, fmt.Errorf("instance identity: GCE metadata %s: %w", f.what, err)
		}
		*f.to = strings.TrimSpace(*f.to)
	}
	in.Hostname = cloud.FirstLabel(in.Hostname)
	if in.Hostname == "" {
		in.Hostname = in.InstanceName
	}
	return in, nil
}

// SelectsVolume implements cloud.Cloud: etcd.volume.gceName or gceLabels.
func (Cloud) SelectsVolume(v *config.Volume) bool { return v.GCEName != "" || len(v.GCELabels) > 0 }

// EtcdVolume implements cloud.Cloud: the disk (named, or selected by its labels),
// attached through the Compute API with the instance's service account; project, zone
// and instance are in's.
func (Cloud) EtcdVolume(ctx context.Context, n *config.Node, v *config.Volume, in cloud.Instance, log *slog.Logger) (etcdvolume.Finder, error) {
	svc, err := computeService(ctx, n)
	if err != nil {
		return nil, err
	}
	return Disk{Service: svc, Project: in.Project, Zone: in.Zone, Instance: in.InstanceName, DiskName: v.GCEName,
		Labels: v.GCELabels, MountPath: v.MountPath, Log: log}, nil
}

// DNS implements cloud.Cloud: Cloud DNS, in the instance's project, for dns.provider
// clouddns.
func (Cloud) DNS(ctx context.Context, n *config.Node) (dns.Provider, error) {
	if n.DNS.Provider != config.DNSCloudDNS {
		return nil, nil
	}
	project, err := MetadataClient().ProjectIDWithContext(ctx)
	if err != nil {
		return nil, fmt.Errorf("clouddns: GCE metadata: %w", err)
	}
	svc, err := cloudDNSService(ctx, n)
	if err != nil {
		return nil, fmt.Errorf("clouddns: %w", err)
	}
	return &CloudDNS{Service: svc, Project: project, Zone: n.DNS.Zone}, nil
}

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
