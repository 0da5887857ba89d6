package aws

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"

	sdkaws "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ebs"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/aws-sdk-go-v2/service/sts"
	"golang.org/x/sync/errgroup"

	"github.com/kilnproject/kiln/builder/publish"
)

// rawSums are the digests of a raw image, read once before any request: the SHA-256 of each
// block that is not all zeros, which is what a snapshot kiln makes of the file holds.
type rawSums struct {
	blocks map[int32][sha256.Size]byte
}

// hashRaw reads im's file, checks it against the SHA-256 its metadata records and returns its
// block digests. The last block, when the file ends inside it, is padded with zeros.
func hashRaw(im *publish.Image) (*rawSums, error) {
	f, err := os.Open(im.Path)
	if err != nil {
		return nil, fmt.Errorf("publish aws: %w", err)
	}
	defer f.Close()
	whole := sha256.New()
	sums := &rawSums{blocks: map[int32][sha256.Size]byte{}}
	buf, zero := make([]byte, blockSize), make([]byte, blockSize)
	for i := int32(0); ; i++ {
		n, err := io.ReadFull(f, buf)
		if n > 0 {
			whole.Write(buf[:n])
			clear(buf[n:])
			if !bytes.Equal(buf, zero) {
				sums.blocks[i] = sha256.Sum256(buf)
			}
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("publish aws: read %s: %w", im.Path, err)
		}
	}
	if err := checkDigest(im.Path, whole, im.SHA256); err != nil {
		return nil, err
	}
	return sums, nil
}

// checkDigest refuses a file whose SHA-256 (whole, as read) is not the one its metadata
// records (want).
func checkDigest(path string, whole hash.Hash, want string) error {
	if got := hex.EncodeToString(whole.Sum(nil)); got != want {
		return fmt.Errorf("publish aws: %s has SHA-256 %s, but its metadata says %s: the file changed after the bake", path, got, want)
	}
	return nil
}

// callerAccount is the account of the credentials: every snapshot and AMI kiln reuses must be
// its own, whatever a Describe call filtered.
func (a *Publisher) callerAccount(ctx context.Context) (string, error) {
	out, err := a.STS.GetCallerIdentity(ctx, &sts.GetCallerIdentityInput{})
	if err != nil {
		return "", apiErr(a.Region, "GetCallerIdentity", err)
	}
	acct := sdkaws.ToString(out.Account)
	if !accountID.MatchString(acct) {
		return "", fmt.Errorf("publish aws: GetCallerIdentity in %s: account %q is not a 12-digit account id", a.Region, acct)
	}
	return acct, nil
}

// A notImageError says why a snapshot or an AMI that carries the image's digest tag is not
// one kiln can tie to the file's bytes.
type notImageError struct{ what, why string }

func (e *notImageError) Error() string {
	return e.what + " is not what kiln makes of this file: " + e.why
}

func notImage(what, format string, a ...any) error {
	return &notImageError{what: what, why: fmt.Sprintf(format, a...)}
}

// checkAMI checks that img, found by its name and digest tag, is an AMI kiln made of im:
// registered as kiln registers AMIs, its one volume a completed snapshot of the account's
// that holds exactly the file's bytes. It returns that snapshot's id.
func (a *Publisher) checkAMI(ctx context.Context, img *types.Image, account string, im *publish.Image, sums *rawSums) (string, error) {
	snap, err := amiShape(img)
	if err != nil {
		return "", err
	}
	out, err := a.EC2.DescribeSnapshots(ctx, &ec2.DescribeSnapshotsInput{SnapshotIds: []string{snap}})
	if err != nil {
		return "", apiErr(a.Region, "DescribeSnapshots", err)
	}
	if len(out.Snapshots) != 1 {
		return "", notImage("snapshot "+snap, "DescribeSnapshots answered %d snapshots of that id", len(out.Snapshots))
	}
	s := out.Snapshots[0]
	if owner := sdkaws.ToString(s.OwnerId); owner != account {
		return "", notImage("snapshot "+snap, "it belongs to account %s, not to the caller's %s", owner, account)
	}
	if s.State != types.SnapshotStateCompleted {
		return "", notImage("snapshot "+snap, "it is %s", s.State)
	}
	return snap, a.verifySnapshot(ctx, snap, im, sums)
}

// amiShape checks that img is registered as kiln registers AMIs (UEFI, IMDSv2 required,
// x86_64, one volume: the root device's snapshot) and returns that snapshot.
func amiShape(img *types.Image) (string, error) {
	what := "AMI " + sdkaws.ToString(img.ImageId)
	if img.BootMode != types.BootModeValuesUefi || img.ImdsSupport != types.ImdsSupportValuesV20 || img.Architecture != types.ArchitectureValuesX8664 {
		return "", notImage(what, "boot mode %q, IMDS support %q, architecture %q, where kiln registers uefi, v2.0, x86_64",
			img.BootMode, img.ImdsSupport, img.Architecture)
	}
	snap := rootSnapshot(img)
	if len(img.BlockDeviceMappings) != 1 || snap == "" {
		return "", notImage(what, "%d block device mappings, where kiln registers one, the root volume's snapshot", len(img.BlockDeviceMappings))
	}
	return snap, nil
}

// isCopyOf checks that img is EC2's copy of the AMI source in region.
func isCopyOf(img *types.Image, region, source string) error {
	if r, id := sdkaws.ToString(img.SourceImageRegion), sdkaws.ToString(img.SourceImageId); r != region || id != source {
		return notImage("AMI "+sdkaws.ToString(img.ImageId), "EC2 says it is a copy of %q in %q, not of %s in %s", id, r, source, region)
	}
	return nil
}

// verifySnapshot reads the snapshot id back through the EBS direct APIs and checks that it
// holds exactly what kiln puts of im: a volume of the disk's size whose written blocks are
// the file's blocks that are not zeros, each holding the file's data. Every block read is
// hashed here and compared with the file's, and with the checksum EBS sends.
func (a *Publisher) verifySnapshot(ctx context.Context, id string, im *publish.Image, sums *rawSums) error {
	tokens, err := a.snapshotBlocks(ctx, id, im)
	if err != nil {
		return err
	}
	for i := range sums.blocks {
		if _, ok := tokens[i]; !ok {
			return notImage("snapshot "+id, "block %d holds data in the file but was never written", i)
		}
	}
	for i := range tokens {
		if _, ok := sums.blocks[i]; !ok {
			return notImage("snapshot "+id, "block %d was written, but the file holds zeros there", i)
		}
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(a.workers())
	for i, token := range tokens {
		g.Go(func() error { return a.checkBlock(gctx, id, i, token, sums.blocks[i]) })
	}
	return g.Wait()
}

// snapshotBlocks lists the written blocks of the snapshot id: their tokens by index.
func (a *Publisher) snapshotBlocks(ctx context.Context, id string, im *publish.Image) (map[int32]string, error) {
	tokens := map[int32]string{}
	p := ebs.NewListSnapshotBlocksPaginator(a.EBS, &ebs.ListSnapshotBlocksInput{SnapshotId: sdkaws.String(id)})
	for p.HasMorePages() {
		out, err := p.NextPage(ctx)
		if err != nil {
			return nil, apiErr(a.Region, "ListSnapshotBlocks", fmt.Errorf("snapshot %s: %w", id, err))
		}
		if gib, bs := sdkaws.ToInt64(out.VolumeSize), sdkaws.ToInt32(out.BlockSize); gib != int64(volumeGiB(im)) || bs != blockSize {
			return nil, notImage("snapshot "+id, "a %d GiB volume of %d-byte blocks, where the image makes %d GiB of %d", gib, bs, volumeGiB(im), blockSize)
		}
		for _, b := range out.Blocks {
			tokens[sdkaws.ToInt32(b.BlockIndex)] = sdkaws.ToString(b.BlockToken)
		}
	}
	return tokens, nil
}

// checkBlock reads block i of the snapshot id and checks that its data has the SHA-256 want.
func (a *Publisher) checkBlock(ctx context.Context, id string, i int32, token string, want [sha256.Size]byte) error {
	out, err := a.EBS.GetSnapshotBlock(ctx, &ebs.GetSnapshotBlockInput{
		SnapshotId: sdkaws.String(id), BlockIndex: sdkaws.Int32(i), BlockToken: sdkaws.String(token),
	})
	if err != nil {
		return apiErr(a.Region, "GetSnapshotBlock", fmt.Errorf("snapshot %s block %d: %w", id, i, err))
	}
	defer out.BlockData.Close()
	data, err := io.ReadAll(io.LimitReader(out.BlockData, blockSize+1))
	if err != nil {
		return fmt.Errorf("publish aws: GetSnapshotBlock in %s: snapshot %s block %d: %w", a.Region, id, i, err)
	}
	sum := sha256.Sum256(data)
	if got := base64.StdEncoding.EncodeToString(sum[:]); sdkaws.ToString(out.Checksum) != got {
		return fmt.Errorf("publish aws: GetSnapshotBlock in %s: snapshot %s block %d: EBS sent checksum %s for data whose SHA-256 is %s",
			a.Region, id, i, sdkaws.ToString(out.Checksum), got)
	}
	if len(data) != blockSize || sum != want {
		return notImage("snapshot "+id, "block %d differs from the file's", i)
	}
	return nil
}
