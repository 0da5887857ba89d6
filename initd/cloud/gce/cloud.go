// Package gce is kiln-init's Google Compute Engine: the metadata server's config
// source, the instance's identity from it, the default service account's token and the
// API clients with node.yaml's endpoints, the persistent-disk finder of the etcd volume
// and Cloud DNS for the node's names, behind cloud.Cloud.
package gce

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
	return readInstance(ctx, newMetadataClient("", nil))
}

// SelectsVolume implements cloud.Cloud: etcd.volume.gceName or gceLabels.
func (Cloud) SelectsVolume(v *config.Volume) bool { return v.GCEName != "" || len(v.GCELabels) > 0 }

// EtcdVolume implements cloud.Cloud: the disk (named, or selected by its labels),
// attached through the Compute API with the instance's service account; project, zone
// and instance are in's.
func (Cloud) EtcdVolume(ctx context.Context, n *config.Node, v *config.Volume, in cloud.Instance, log *slog.Logger) (etcdvolume.Finder, error) {
	svc, err := computeService(n, newMetadataClient("", nil))
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
	md := newMetadataClient("", nil)
	project, err := md.getTrimmed(ctx, "project/project-id")
	if err != nil {
		return nil, fmt.Errorf("clouddns: GCE metadata project/project-id: %w", err)
	}
	svc, err := cloudDNSService(n, md)
	if err != nil {
		return nil, fmt.Errorf("clouddns: %w", err)
	}
	return &CloudDNS{Service: svc, Project: project, Zone: n.DNS.Zone}, nil
}
