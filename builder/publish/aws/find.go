package aws

import (
	"context"
	"errors"
	"fmt"

	sdkaws "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/kilnproject/kiln/builder/publish"
)

// findImage returns the AMI called name that account owns in region, once it is available,
// or nil when there is none. An AMI of that name made from another image, or one that failed,
// is an error: the name is taken. AMIs of other accounts are ignored, whatever the endpoint
// answered to Owner=self.
func (a *Publisher) findImage(ctx context.Context, c *ec2.Client, region, account, name, digest string) (*types.Image, error) {
	out, err := c.DescribeImages(ctx, &ec2.DescribeImagesInput{
		Owners:  []string{"self"},
		Filters: []types.Filter{{Name: sdkaws.String("name"), Values: []string{name}}},
	})
	if err != nil {
		return nil, apiErr(region, "DescribeImages", err)
	}
	var img *types.Image
	for i, it := range out.Images {
		if owner := sdkaws.ToString(it.OwnerId); owner != account || sdkaws.ToString(it.Name) != name {
			a.log().Warn("publish aws: ignoring an AMI DescribeImages answered that is not the account's of that name",
				"image", sdkaws.ToString(it.ImageId), "owner", owner, "name", sdkaws.ToString(it.Name), "region", region)
			continue
		}
		img = &out.Images[i]
	}
	if img == nil {
		return nil, nil
	}
	id := sdkaws.ToString(img.ImageId)
	if got := tagValue(img.Tags, DigestTag); got != digest {
		return nil, fmt.Errorf("publish aws: the name %q is taken in %s by %s (%s=%q), not this image (%s): choose another --name or deregister %s",
			name, region, id, DigestTag, got, digest, id)
	}
	switch img.State {
	case types.ImageStateAvailable:
		return img, nil
	case types.ImageStatePending:
		a.log().Info("publish aws: waiting for the image an earlier publish registered", "image", id, "region", region)
		return a.waitImage(ctx, c, region, id)
	}
	return nil, fmt.Errorf("publish aws: %s in %s, of this image, is %s: deregister it and publish again", id, region, img.State)
}

// findSnapshot returns the id of a completed snapshot of the account's that holds exactly
// im's bytes (from an earlier publish under another name, or one that failed after its
// upload), or "". Snapshots tagged with the digest that do not are passed over, logged.
func (a *Publisher) findSnapshot(ctx context.Context, im *publish.Image, account string, sums *rawSums) (string, error) {
	out, err := a.EC2.DescribeSnapshots(ctx, &ec2.DescribeSnapshotsInput{
		OwnerIds: []string{"self"},
		Filters: []types.Filter{
			{Name: sdkaws.String("tag:" + DigestTag), Values: []string{im.SHA256}},
			{Name: sdkaws.String("status"), Values: []string{string(types.SnapshotStateCompleted)}},
		},
	})
	if err != nil {
		return "", apiErr(a.Region, "DescribeSnapshots", err)
	}
	for _, s := range out.Snapshots {
		id := sdkaws.ToString(s.SnapshotId)
		if sdkaws.ToString(s.OwnerId) != account || s.State != types.SnapshotStateCompleted || sdkaws.ToInt32(s.VolumeSize) != volumeGiB(im) {
			continue
		}
		err := a.verifySnapshot(ctx, id, im, sums)
		var ni *notImageError
		switch {
		case err == nil:
			return id, nil
		case errors.As(err, &ni):
			a.log().Warn("publish aws: not reusing a snapshot tagged with this image's digest", "snapshot", id, "region", a.Region, "reason", ni.why)
		default:
			return "", err
		}
	}
	return "", nil
}

// rootSnapshot is the snapshot of img's root device.
func rootSnapshot(img *types.Image) string {
	for _, m := range img.BlockDeviceMappings {
		if sdkaws.ToString(m.DeviceName) == sdkaws.ToString(img.RootDeviceName) && m.Ebs != nil {
			return sdkaws.ToString(m.Ebs.SnapshotId)
		}
	}
	return ""
}

func tagValue(tags []types.Tag, key string) string {
	for _, t := range tags {
		if sdkaws.ToString(t.Key) == key {
			return sdkaws.ToString(t.Value)
		}
	}
	return ""
}

// volumeGiB is the size of im's disk in GiB, rounded up: the EBS volume size.
func volumeGiB(im *publish.Image) int32 {
	return int32((im.DiskSize() + 1<<30 - 1) >> 30)
}
