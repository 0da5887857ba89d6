package firstboot

import (
	"context"

	"github.com/kilnproject/kiln/initd/cloud"
	"github.com/kilnproject/kiln/initd/cloud/aws"
	"github.com/kilnproject/kiln/initd/cloud/gce"
	"github.com/kilnproject/kiln/initd/config"
	"github.com/kilnproject/kiln/initd/firstboot/facts"
	"github.com/kilnproject/kiln/initd/source"
)

// clouds are the cloud platforms kiln-init runs on: adding one is its package below
// initd/cloud and a line here.
var clouds = []cloud.Cloud{aws.Cloud{}, gce.Cloud{}}

// cloudNamed is the cloud whose kiln.platform= value is name, or nil.
func cloudNamed(name string) cloud.Cloud {
	for _, c := range clouds {
		if c.Name() == name {
			return c
		}
	}
	return nil
}

// cloudSources are the clouds as source.ForPlatform takes them.
func cloudSources() []source.Cloud {
	cs := make([]source.Cloud, len(clouds))
	for i, c := range clouds {
		cs[i] = c
	}
	return cs
}

// instance is what first boot learns about the machine from its platform's metadata
// service.
type instance = cloud.Instance

// readInstance asks the metadata service of platform (a cloud's name) who this instance
// is; on other platforms it knows nothing.
func readInstance(ctx context.Context, platform string, n *config.Node) (instance, error) {
	if c := cloudNamed(platform); c != nil {
		return c.Identify(ctx, n)
	}
	return instance{Cloud: platform}, nil
}

// platformFacts are the facts an instance's identity gives.
func platformFacts(in instance) facts.Platform {
	return facts.Platform{Name: in.Cloud, Hostname: in.Hostname, InstanceID: in.InstanceID, Zone: in.Zone}
}
