package gce

import (
	"cmp"
	"fmt"

	"github.com/kilnproject/kiln/initd/config"
)

// The node's GCE API clients. Credentials come from the instance: the default service
// account's token, from the metadata server. node.yaml's gce.endpoints point the clients
// elsewhere (Private Service Connect endpoints), as base URLs in place of these.
const (
	defaultComputeEndpoint = "https://compute.googleapis.com/compute/v1/"
	defaultDNSEndpoint     = "https://dns.googleapis.com/"
)

// computeService is the Compute Engine client for the node's etcd disk.
func computeService(n *config.Node, md *metadataClient) (*ComputeService, error) {
	svc, err := newComputeService(cmp.Or(n.GCE.Endpoints.Compute, defaultComputeEndpoint), newMetadataToken(md))
	if err != nil {
		return nil, fmt.Errorf("compute API: %w", err)
	}
	return svc, nil
}

// cloudDNSService is the Cloud DNS client for the node's names.
func cloudDNSService(n *config.Node, md *metadataClient) (*DNSService, error) {
	svc, err := newDNSService(cmp.Or(n.GCE.Endpoints.DNS, defaultDNSEndpoint), newMetadataToken(md))
	if err != nil {
		return nil, fmt.Errorf("cloud DNS API: %w", err)
	}
	return svc, nil
}
