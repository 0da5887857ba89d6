package gce

import (
	"context"
	"fmt"
	"strings"

	"github.com/kilnproject/kiln/initd/cloud"
)

// readInstance reads the instance's identity from the GCE metadata server. The zone is
// the last part of instance/zone (projects/123/zones/europe-west4-b); the hostname is the
// first label of instance/hostname (cp-a.c.proj.internal → cp-a), else the instance name.
func readInstance(ctx context.Context, md *metadataClient) (cloud.Instance, error) {
	in := cloud.Instance{Cloud: "gce"}
	for _, f := range []struct {
		path string
		to   *string
	}{
		{"instance/id", &in.InstanceID},
		{"instance/name", &in.InstanceName},
		{"instance/zone", &in.Zone},
		{"project/project-id", &in.Project},
		{"instance/hostname", &in.Hostname},
	} {
		v, err := md.getTrimmed(ctx, f.path)
		if err != nil {
			return in, fmt.Errorf("instance identity: GCE metadata %s: %w", f.path, err)
		}
		*f.to = v
	}
	in.Zone = in.Zone[strings.LastIndex(in.Zone, "/")+1:]
	in.Hostname = cloud.FirstLabel(in.Hostname)
	if in.Hostname == "" {
		in.Hostname = in.InstanceName
	}
	return in, nil
}
