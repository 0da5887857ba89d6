package gce

import (
	"context"
	"fmt"
	"strings"

	"cloud.google.com/go/compute/metadata"

	"github.com/kilnproject/kiln/initd/cloud"
)

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
