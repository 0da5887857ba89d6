package aws

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	sdkaws "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/kilnproject/kiln/builder/publish"
)

// share lets each account launch the AMI image in region and create volumes from its
// snapshot. Adding a permission an account has already is not an error.
func (a *Publisher) share(ctx context.Context, c *ec2.Client, region, image, snapshot string, accounts []string) error {
	if len(accounts) == 0 {
		return nil
	}
	var perms []types.LaunchPermission
	for _, acct := range accounts {
		perms = append(perms, types.LaunchPermission{UserId: sdkaws.String(acct)})
	}
	if _, err := c.ModifyImageAttribute(ctx, &ec2.ModifyImageAttributeInput{
		ImageId:          sdkaws.String(image),
		LaunchPermission: &types.LaunchPermissionModifications{Add: perms},
	}); err != nil {
		return apiErr(region, "ModifyImageAttribute", err)
	}
	if snapshot == "" {
		return nil
	}
	if _, err := c.ModifySnapshotAttribute(ctx, &ec2.ModifySnapshotAttributeInput{
		SnapshotId:    sdkaws.String(snapshot),
		Attribute:     types.SnapshotAttributeNameCreateVolumePermission,
		OperationType: types.OperationTypeAdd,
		UserIds:       accounts,
	}); err != nil {
		return apiErr(region, "ModifySnapshotAttribute", err)
	}
	a.log().Info("publish aws: shared", "image", image, "region", region, "accounts", strings.Join(accounts, ","))
	return nil
}

// copyAll copies the AMI to every region of r.CopyTo that lacks it, at once, and shares
// each copy. The AMI in the home region stays when a copy fails: publishing again finds it
// and makes the missing copies.
func (a *Publisher) copyAll(ctx context.Context, im *publish.Image, account string, r Request, res *Result) error {
	var mu sync.Mutex
	var wg sync.WaitGroup
	var errs []error
	regions := slices.Compact(slices.Sorted(slices.Values(r.CopyTo)))
	for _, region := range regions {
		wg.Go(func() {
			id, err := a.copyTo(ctx, im, account, r, res.ImageID, region)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			res.Copies[region] = id
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		return fmt.Errorf("publish aws: image %s is registered in %s, but copying failed (publish again to make the missing copies): %w",
			res.ImageID, a.Region, errors.Join(errs...))
	}
	return nil
}

// copyTo makes sure region has a copy of the AMI source, copying it unless an earlier
// publish did (an AMI of the name there must be the account's copy of source), and shares
// it. It returns the copy's id.
func (a *Publisher) copyTo(ctx context.Context, im *publish.Image, account string, r Request, source, region string) (string, error) {
	c := a.EC2In(region)
	img, err := a.findImage(ctx, c, region, account, r.Name, im.SHA256)
	if err != nil {
		return "", err
	}
	if img != nil {
		if err := isCopyOf(img, a.Region, source); err != nil {
			return "", nameHeld(r.Name, region, img, err)
		}
	} else {
		tags := append(r.tags(im), kv{"kiln:source", a.Region + "/" + source})
		out, err := c.CopyImage(ctx, &ec2.CopyImageInput{
			Name:              sdkaws.String(r.Name),
			Description:       sdkaws.String(description(im)),
			SourceImageId:     sdkaws.String(source),
			SourceRegion:      sdkaws.String(a.Region),
			TagSpecifications: tagSpecs(tags, types.ResourceTypeImage, types.ResourceTypeSnapshot),
			// A retry whose first answer was lost gets the copy the first made.
			ClientToken: sdkaws.String(rand.Text()),
		})
		if err != nil {
			return "", apiErr(region, "CopyImage", err)
		}
		id := sdkaws.ToString(out.ImageId)
		a.log().Info("publish aws: copying", "image", id, "region", region, "from", source)
		if img, err = a.waitImage(ctx, c, region, id); err != nil {
			return "", a.undo(ctx, c, region, err, id, "")
		}
	}
	id := sdkaws.ToString(img.ImageId)
	if err := a.share(ctx, c, region, id, rootSnapshot(img), r.ShareWith); err != nil {
		return "", err
	}
	return id, nil
}
