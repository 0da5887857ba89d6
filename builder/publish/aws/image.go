package aws

import (
	"context"
	"fmt"

	sdkaws "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/kilnproject/kiln/builder/publish"
)

// rootDevice is the AMI's root device name.
const rootDevice = "/dev/xvda"

// register waits for the snapshot to complete and registers the AMI from it: UEFI, ENA,
// IMDSv2 required, x86_64, the root volume a gp3 of the disk's size. An AMI that does not
// become available is deregistered. When the name turns out taken by the AMI this call made
// (its answer was lost, and the retry was refused), that AMI is the answer.
func (a *Publisher) register(ctx context.Context, im *publish.Image, r Request, snapshot, account string) (string, error) {
	w := ec2.NewSnapshotCompletedWaiter(a.EC2, func(o *ec2.SnapshotCompletedWaiterOptions) {
		o.MinDelay, o.MaxDelay = a.poll(), a.poll()
	})
	if err := w.Wait(ctx, &ec2.DescribeSnapshotsInput{SnapshotIds: []string{snapshot}}, a.maxWait()); err != nil {
		return "", apiErr(a.Region, "DescribeSnapshots", fmt.Errorf("snapshot %s did not complete: %w", snapshot, err))
	}
	out, err := a.EC2.RegisterImage(ctx, &ec2.RegisterImageInput{
		Name:               sdkaws.String(r.Name),
		Description:        sdkaws.String(description(im)),
		Architecture:       types.ArchitectureValuesX8664,
		BootMode:           types.BootModeValuesUefi,
		EnaSupport:         sdkaws.Bool(true),
		ImdsSupport:        types.ImdsSupportValuesV20,
		VirtualizationType: sdkaws.String("hvm"),
		RootDeviceName:     sdkaws.String(rootDevice),
		BlockDeviceMappings: []types.BlockDeviceMapping{{
			DeviceName: sdkaws.String(rootDevice),
			Ebs: &types.EbsBlockDevice{
				SnapshotId:          sdkaws.String(snapshot),
				VolumeSize:          sdkaws.Int32(volumeGiB(im)),
				VolumeType:          types.VolumeTypeGp3,
				DeleteOnTermination: sdkaws.Bool(true),
			},
		}},
		TagSpecifications: tagSpecs(r.tags(im), types.ResourceTypeImage),
	})
	if errorCode(err) == "InvalidAMIName.Duplicate" {
		return a.adopt(ctx, im, r, snapshot, account, err)
	}
	if err != nil {
		return "", apiErr(a.Region, "RegisterImage", err)
	}
	id := sdkaws.ToString(out.ImageId)
	a.log().Info("publish aws: registered", "image", id, "region", a.Region)
	if _, err := a.waitImage(ctx, a.EC2, a.Region, id); err != nil {
		return "", a.undo(ctx, a.EC2, a.Region, err, id, "")
	}
	return id, nil
}

// adopt returns the AMI called r.Name after RegisterImage failed with dup, the name taken: it
// is the AMI this publish registered when it is the account's, tagged with im's digest and
// registered as kiln does from snapshot. Otherwise the error names the AMI holding the name.
func (a *Publisher) adopt(ctx context.Context, im *publish.Image, r Request, snapshot, account string, dup error) (string, error) {
	img, err := a.findImage(ctx, a.EC2, a.Region, account, r.Name, im.SHA256)
	if err != nil {
		return "", err
	}
	if img == nil {
		return "", apiErr(a.Region, "RegisterImage", dup)
	}
	id := sdkaws.ToString(img.ImageId)
	snap, err := amiShape(img)
	if err == nil && snap != snapshot {
		err = notImage("AMI "+id, "it was registered from snapshot %s, not from %s", snap, snapshot)
	}
	if err != nil {
		return "", fmt.Errorf("publish aws: RegisterImage in %s: the name %q is taken: %w", a.Region, r.Name, err)
	}
	a.log().Info("publish aws: the name is held by the AMI registered from this snapshot (an answer was lost); using it", "image", id, "region", a.Region)
	return id, nil
}

// waitImage waits until the AMI id in region is available and returns it.
func (a *Publisher) waitImage(ctx context.Context, c *ec2.Client, region, id string) (*types.Image, error) {
	w := ec2.NewImageAvailableWaiter(c, func(o *ec2.ImageAvailableWaiterOptions) {
		o.MinDelay, o.MaxDelay = a.poll(), a.poll()
	})
	out, err := w.WaitForOutput(ctx, &ec2.DescribeImagesInput{ImageIds: []string{id}}, a.maxWait())
	if err != nil {
		return nil, apiErr(region, "DescribeImages", fmt.Errorf("image %s did not become available: %w", id, err))
	}
	if len(out.Images) != 1 {
		return nil, fmt.Errorf("publish aws: DescribeImages in %s: %d images of id %s", region, len(out.Images), id)
	}
	return &out.Images[0], nil
}

// description is the AMI's description: what was baked, and the file's digest.
func description(im *publish.Image) string {
	md := im.Metadata
	return fmt.Sprintf("kiln %s role %s, kernel %s, sha256:%s", md.Name, md.Role, md.Kernel.Version, im.SHA256)
}

// tagSpecs tags resources of each type with tags.
func tagSpecs(tags []kv, kinds ...types.ResourceType) []types.TagSpecification {
	var ts []types.Tag
	for _, t := range tags {
		ts = append(ts, types.Tag{Key: sdkaws.String(t.key), Value: sdkaws.String(t.value)})
	}
	var specs []types.TagSpecification
	for _, rt := range kinds {
		specs = append(specs, types.TagSpecification{ResourceType: rt, Tags: ts})
	}
	return specs
}
