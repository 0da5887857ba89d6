package aws

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	sdkaws "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/ec2/imds"

	"github.com/kilnproject/kiln/initd/cloud"
)

// readInstance reads the instance's identity from IMDSv2 at endpoint ("" the default).
// The hostname is the first label of EC2's local-hostname.
func readInstance(ctx context.Context, endpoint string) (cloud.Instance, error) {
	md := imds.New(imds.Options{Endpoint: endpoint, HTTPClient: CapIMDS(nil), EnableFallback: sdkaws.FalseTernary})
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
	in := cloud.Instance{Cloud: "aws"}
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
	in.Hostname = cloud.FirstLabel(host)
	return in, err
}
