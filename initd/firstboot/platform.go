package firstboot

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"cloud.google.com/go/compute/metadata"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/ec2/imds"

	"github.com/kilnproject/kiln/initd/config"
	"github.com/kilnproject/kiln/initd/firstboot/facts"
	"github.com/kilnproject/kiln/initd/source"
)

// identityTimeout bounds the reads of the instance's identity from the metadata service.
const identityTimeout = time.Minute

// instance is what first boot learns about the machine from its platform's metadata
// service: the facts (hostname, instance id, zone) and what the cloud APIs address the
// instance by.
type instance struct {
	facts.Platform
	InstanceName string // GCE: the instance name, which the compute API takes
	Project      string // GCE: the project id
}

// readInstance asks the metadata service of platform (aws, gce) who this instance is; on
// other platforms it knows nothing. The hostname is the first label of the name the
// platform gives (EC2's local-hostname ip-10-0-1-5.eu-west-1.compute.internal →
// ip-10-0-1-5; GCE's instance/hostname cp-a.c.proj.internal → cp-a), so it is a node name
// without the cloud's private domain.
func readInstance(ctx context.Context, platform string, n *config.Node) (instance, error) {
	ctx, cancel := context.WithTimeout(ctx, identityTimeout)
	defer cancel()
	switch platform {
	case "aws":
		var endpoint string
		if n != nil {
			endpoint = n.AWS.Endpoints.IMDS
		}
		return readEC2Instance(ctx, endpoint)
	case "gce":
		return readGCEInstance(ctx, source.GCEMetadataClient())
	}
	return instance{Platform: facts.Platform{Name: platform}}, nil
}

// readEC2Instance reads the instance's identity from IMDSv2 at endpoint ("" the default).
func readEC2Instance(ctx context.Context, endpoint string) (instance, error) {
	md := imds.New(imds.Options{Endpoint: endpoint, HTTPClient: source.CapIMDS(nil), EnableFallback: aws.FalseTernary})
	get := func(path string, optional bool) (string, error) {
		out, err := md.GetMetadata(ctx, &imds.GetMetadataInput{Path: path})
		if err != nil {
			var se interface{ HTTPStatusCode() int }
			if optional && errors.As(err, &se) && se.HTTPStatusCode() == http.StatusNotFound {
				return "", nil
			}
			return "", fmt.Errorf("instance identity: IMDS %s: %w", path, err)
		}
		defer out.Content.Close()
		b, err := io.ReadAll(out.Content)
		if err != nil {
			return "", fmt.Errorf("instance identity: IMDS %s: %w", path, err)
		}
		return strings.TrimSpace(string(b)), nil
	}
	in := instance{Platform: facts.Platform{Name: "aws"}}
	var err error
	if in.InstanceID, err = get("instance-id", false); err != nil {
		return in, err
	}
	if in.Zone, err = get("placement/availability-zone", false); err != nil {
		return in, err
	}
	// An instance whose hostname type is resource name, or one in an IPv6-only subnet,
	// may have no local-hostname.
	host, err := get("local-hostname", true)
	in.Hostname = firstLabel(host)
	return in, err
}

// readGCEInstance reads the instance's identity from the GCE metadata server.
func readGCEInstance(ctx context.Context, md *metadata.Client) (instance, error) {
	in := instance{Platform: facts.Platform{Name: "gce"}}
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
	in.Hostname = firstLabel(in.Hostname)
	if in.Hostname == "" {
		in.Hostname = in.InstanceName
	}
	return in, nil
}

// firstLabel is a host name's first label: ip-10-0-1-5.eu-west-1.compute.internal →
// ip-10-0-1-5.
func firstLabel(name string) string {
	first, _, _ := strings.Cut(strings.TrimSpace(name), ".")
	return first
}
