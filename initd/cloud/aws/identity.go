package aws

import (
	"context"
	"fmt"
	"strings"

	"github.com/kilnproject/kiln/initd/cloud"
)

// readInstance reads the instance's identity from IMDSv2 at endpoint ("" the default).
// The hostname is the first label of EC2's local-hostname.
func readInstance(ctx context.Context, endpoint string) (cloud.Instance, error) {
	md := newIMDSClient(endpoint, nil)
	get := func(path string, optional bool) (string, error) {
		b, err := md.metadata(ctx, path)
		if err != nil {
			if optional && imdsNotFound(err, metadataPath(path)) {
				return "", nil
			}
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
