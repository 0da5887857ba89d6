package aws

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	sdkaws "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/smithy-go"
)

// services are the services of the calls that are not EC2's.
var services = map[string]string{
	"StartSnapshot": "ebs", "PutSnapshotBlock": "ebs", "CompleteSnapshot": "ebs",
	"ListSnapshotBlocks": "ebs", "GetSnapshotBlock": "ebs", "GetCallerIdentity": "sts",
}

// refusedCredentials are the error codes of a call whose credentials AWS did not accept (not
// known, expired, signed with another secret or clock), which no IAM permission cures.
var refusedCredentials = map[string]bool{
	"AuthFailure": true, "UnrecognizedClientException": true, "InvalidClientTokenId": true,
	"SignatureDoesNotMatch": true, "InvalidSignatureException": true, "IncompleteSignature": true,
	"ExpiredToken": true, "ExpiredTokenException": true, "RequestExpired": true,
}

// errorCode is the AWS error code of err, or "".
func errorCode(err error) string {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		return ae.ErrorCode()
	}
	return ""
}

// apiErr wraps the error of the call op in region. A refused call names the IAM permission
// the credentials lack; refused credentials are said to be so.
func apiErr(region, op string, err error) error {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		code := ae.ErrorCode()
		switch {
		case refusedCredentials[code]:
			return fmt.Errorf("publish aws: %s in %s: the credentials were refused (%s: %s): check the access key, secret and session token the SDK found, and the clock",
				op, region, code, ae.ErrorMessage())
		case code == "AccessDeniedException" || code == "AccessDenied" || code == "UnauthorizedOperation":
			service := services[op]
			if service == "" {
				service = "ec2"
			}
			return fmt.Errorf("publish aws: %s in %s: access denied: the credentials need the IAM permission %s:%s (%s)",
				op, region, service, op, ae.ErrorMessage())
		}
	}
	return fmt.Errorf("publish aws: %s in %s: %w", op, region, err)
}

// undo deletes the image and the snapshot this run made in region (either may be ""), after
// cause made the publish fail. It returns cause, with what could not be deleted named.
// Deleting goes on when ctx was canceled: an interrupted publish cleans up too.
func (a *Publisher) undo(ctx context.Context, c *ec2.Client, region string, cause error, image, snapshot string) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	var left []string
	if image != "" {
		if _, err := c.DeregisterImage(ctx, &ec2.DeregisterImageInput{ImageId: sdkaws.String(image)}); err != nil {
			left = append(left, fmt.Sprintf("image %s (deregister: %v)", image, err))
		} else {
			a.log().Info("publish aws: deregistered", "image", image, "region", region)
		}
	}
	if snapshot != "" {
		if _, err := c.DeleteSnapshot(ctx, &ec2.DeleteSnapshotInput{SnapshotId: sdkaws.String(snapshot)}); err != nil {
			left = append(left, fmt.Sprintf("snapshot %s (delete: %v)", snapshot, err))
		} else {
			a.log().Info("publish aws: deleted", "snapshot", snapshot, "region", region)
		}
	}
	if len(left) > 0 {
		return fmt.Errorf("%w; left behind in %s: %s", cause, region, strings.Join(left, ", "))
	}
	return cause
}
