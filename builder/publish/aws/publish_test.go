package aws

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	sdkaws "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/ebs"
	ebstypes "github.com/aws/aws-sdk-go-v2/service/ebs/types"

	"github.com/kilnproject/kiln/builder/publish"
	"github.com/kilnproject/kiln/builder/publish/publishtest"
)

// testRegion is the region the tests publish in.
const testRegion = "eu-west-1"

// newFakeAWS starts the AWS fake, failing calls as faults say, and returns it with a
// publisher in testRegion whose clients call it, retrying and polling quickly.
func newFakeAWS(t testing.TB, faults ...publishtest.Fault) (*publishtest.AWS, *Publisher) {
	f := publishtest.NewAWS(t)
	f.Inject(faults...)
	return f, fakePublisher(f, f.Client())
}

// fakePublisher is a publisher in testRegion whose clients call f through hc.
func fakePublisher(f *publishtest.AWS, hc *http.Client) *Publisher {
	a := New(Config{
		Config: sdkaws.Config{
			Region:      testRegion,
			Credentials: credentials.NewStaticCredentialsProvider(publishtest.AWSAccessKeyID, publishtest.AWSSecretAccessKey, ""),
			HTTPClient:  hc,
		},
		Endpoint:   f.URL(),
		MaxBackoff: 20 * time.Millisecond,
	})
	a.Poll, a.MaxWait = time.Millisecond, 10*time.Second
	a.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	return a
}

func randBytes(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

// testDiskSize is the size of the test disk: 40 MiB and 100 KiB, so its last block is
// partly past the file's end.
const testDiskSize = 40<<20 + 100<<10

// scattered is the data of the test disk: random data at scattered offsets, one lone byte
// at the end of a block, and data up to the file's end. 6 blocks hold data.
func scattered() map[int64][]byte {
	return map[int64][]byte{
		0:                     randBytes(2 * blockSize),
		7*blockSize + 4096:    randBytes(70000),
		20*blockSize - 1:      {0xff},
		33 * blockSize:        randBytes(blockSize),
		testDiskSize - 50<<10: randBytes(50 << 10),
	}
}

const dataBlocks = 6

// newRequest is a request of the AMI kiln-aws-worker with a tag.
func newRequest() Request {
	return Request{Name: "kiln-aws-worker", Tags: map[string]string{"team": "platform"}}
}

// checkSnapshot reassembles the snapshot and compares it with the image byte for byte,
// the sparse regions and the volume past the file's end included.
func checkSnapshot(t *testing.T, f *publishtest.AWS, region, id string, content []byte) {
	t.Helper()
	if err := f.SnapshotMatches(region, id, content); err != nil {
		t.Fatal(err)
	}
}

// A publish uploads the non-zero blocks into a snapshot equal to the image, registers an
// AMI as EC2 instances of kiln's images need it, shares and copies it; a second publish of
// the same file uploads nothing and returns the same ids.
func TestPublishAWS(t *testing.T) {
	f, a := newFakeAWS(t)
	path, content := publishtest.RawImage(t, t.TempDir(), testDiskSize, scattered())
	im, err := publish.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	req := newRequest()
	req.ShareWith = []string{"444455556666"}
	req.CopyTo = []string{"us-east-1", "eu-central-1"}
	res, err := a.publish(context.Background(), im, req)
	if err != nil {
		t.Fatal(err)
	}
	if res.Reused || res.Region != testRegion || res.Upload == nil || res.Upload.Uploaded != dataBlocks || res.Upload.Skipped != res.Upload.Blocks-dataBlocks {
		t.Errorf("result %+v, upload %+v: want %d blocks uploaded, the rest skipped", res, res.Upload, dataBlocks)
	}
	checkSnapshot(t, f, testRegion, res.SnapshotID, content)
	img := f.Image(testRegion, res.ImageID)
	if img == nil {
		t.Fatalf("no image %s in the fake", res.ImageID)
	}
	for k, want := range map[string]string{
		"Name": "kiln-aws-worker", "Architecture": "x86_64", "BootMode": "uefi", "EnaSupport": "true",
		"ImdsSupport": "v2.0", "VirtualizationType": "hvm", "RootDeviceName": "/dev/xvda",
		"BlockDeviceMapping.1.DeviceName": "/dev/xvda", "BlockDeviceMapping.1.Ebs.VolumeSize": "1",
		"BlockDeviceMapping.1.Ebs.VolumeType": "gp3", "BlockDeviceMapping.1.Ebs.DeleteOnTermination": "true",
		"BlockDeviceMapping.1.Ebs.SnapshotId": res.SnapshotID,
	} {
		if got := img.Params.Get(k); got != want {
			t.Errorf("RegisterImage %s = %q, want %q", k, got, want)
		}
	}
	snap := f.Snapshot(testRegion, res.SnapshotID)
	for what, tags := range map[string]map[string]string{"image": img.Tags, "snapshot": snap.Tags} {
		if tags[DigestTag] != im.SHA256 || tags["team"] != "platform" {
			t.Errorf("%s tags %v, want %s=%s and team=platform", what, tags, DigestTag, im.SHA256)
		}
	}
	if !slices.Equal(img.LaunchPermission, req.ShareWith) || !slices.Equal(snap.VolumePermission, req.ShareWith) {
		t.Errorf("launch permission %v, snapshot volume permission %v, want %v", img.LaunchPermission, snap.VolumePermission, req.ShareWith)
	}
	checkCopies(t, f, res, im, req)

	puts := f.Calls("PutSnapshotBlock")
	again, err := a.publish(context.Background(), im, req)
	if err != nil {
		t.Fatal(err)
	}
	if again.ImageID != res.ImageID || again.SnapshotID != res.SnapshotID || !again.Reused || !maps.Equal(again.Copies, res.Copies) {
		t.Errorf("second publish = %+v, want the ids of the first %+v, reused", again, res)
	}
	if !strings.Contains(again.Reason, "AMI "+res.ImageID) || !strings.Contains(again.Reason, "snapshot "+res.SnapshotID) || !strings.Contains(again.Reason, publishtest.AWSAccount) {
		t.Errorf("second publish says %q, want which AMI and snapshot were reused and why", again.Reason)
	}
	if n := f.Calls("PutSnapshotBlock") - puts; n != 0 || f.Calls("StartSnapshot") != 1 || f.Calls("CopyImage") != 2 {
		t.Errorf("second publish: %d blocks put, %d snapshots started, %d copies in all", n, f.Calls("StartSnapshot"), f.Calls("CopyImage"))
	}
}

// checkCopies checks each region of req.CopyTo has a copy of the AMI, tagged and shared,
// with a snapshot of the same data.
func checkCopies(t *testing.T, f *publishtest.AWS, res *Result, im *publish.Image, req Request) {
	t.Helper()
	if len(res.Copies) != len(req.CopyTo) {
		t.Errorf("copies %v, want one in each of %v", res.Copies, req.CopyTo)
	}
	for _, region := range req.CopyTo {
		c := f.Image(region, res.Copies[region])
		if c == nil {
			t.Errorf("no copy in %s", region)
			continue
		}
		if c.Params.Get("SourceImageId") != res.ImageID || c.Params.Get("SourceRegion") != testRegion || c.Name != req.Name {
			t.Errorf("copy in %s: %v", region, c.Params)
		}
		s := f.Snapshot(region, c.SnapshotID)
		if c.Tags[DigestTag] != im.SHA256 || s.Tags[DigestTag] != im.SHA256 || c.Tags["team"] != "platform" {
			t.Errorf("copy in %s tagged %v, its snapshot %v", region, c.Tags, s.Tags)
		}
		if !slices.Equal(c.LaunchPermission, req.ShareWith) || !slices.Equal(s.VolumePermission, req.ShareWith) {
			t.Errorf("copy in %s shared with %v, its snapshot with %v", region, c.LaunchPermission, s.VolumePermission)
		}
	}
}

// The fake refuses a block whose checksum is not its data's, with EBS's error, so the
// uploads it accepts were checked.
func TestFakeEBSRefusesBadChecksum(t *testing.T) {
	f, a := newFakeAWS(t)
	start, err := a.EBS.StartSnapshot(context.Background(), &ebs.StartSnapshotInput{VolumeSize: sdkaws.Int64(1)})
	if err != nil {
		t.Fatal(err)
	}
	block := randBytes(blockSize)
	sum := sha256.Sum256(block[1:])
	wrong := base64.StdEncoding.EncodeToString(sum[:])
	_, err = a.EBS.PutSnapshotBlock(context.Background(), &ebs.PutSnapshotBlockInput{
		SnapshotId: start.SnapshotId, BlockIndex: sdkaws.Int32(3), BlockData: bytes.NewReader(block),
		DataLength: sdkaws.Int32(blockSize), Checksum: sdkaws.String(wrong),
		ChecksumAlgorithm: ebstypes.ChecksumAlgorithmChecksumAlgorithmSha256,
	})
	var ve *ebstypes.ValidationException
	if !errors.As(err, &ve) || ve.Reason != ebstypes.ValidationExceptionReasonInvalidBlock {
		t.Fatalf("PutSnapshotBlock with a wrong checksum = %v, want a ValidationException INVALID_BLOCK", err)
	}
	if f.Snapshot(testRegion, *start.SnapshotId).Blocks[3] != nil {
		t.Error("the fake stored the refused block")
	}
}

// A name another image holds is refused before anything is uploaded.
func TestPublishAWSNameTaken(t *testing.T) {
	f, a := newFakeAWS(t)
	path, _ := publishtest.RawImage(t, t.TempDir(), testDiskSize, scattered())
	im, _ := publish.Load(path)
	if _, err := a.publish(context.Background(), im, newRequest()); err != nil {
		t.Fatal(err)
	}
	other, _ := publishtest.RawImage(t, t.TempDir(), testDiskSize, scattered())
	im2, _ := publish.Load(other)
	_, err := a.publish(context.Background(), im2, newRequest())
	if err == nil || !strings.Contains(err.Error(), `the name "kiln-aws-worker" is taken`) {
		t.Fatalf("publish of another image under the same name = %v", err)
	}
	if n := f.Calls("StartSnapshot"); n != 1 {
		t.Errorf("%d snapshots started, want only the first publish's", n)
	}
}

// The same file under another name makes a new AMI of the snapshot already uploaded.
func TestPublishAWSReusesSnapshot(t *testing.T) {
	f, a := newFakeAWS(t)
	path, _ := publishtest.RawImage(t, t.TempDir(), testDiskSize, scattered())
	im, _ := publish.Load(path)
	first, err := a.publish(context.Background(), im, newRequest())
	if err != nil {
		t.Fatal(err)
	}
	req := newRequest()
	req.Name = "kiln-aws-worker-2"
	second, err := a.publish(context.Background(), im, req)
	if err != nil {
		t.Fatal(err)
	}
	if second.ImageID == first.ImageID || second.SnapshotID != first.SnapshotID || second.Upload != nil || f.Calls("StartSnapshot") != 1 {
		t.Errorf("second name: %+v after %+v, %d snapshots started", second, first, f.Calls("StartSnapshot"))
	}
	if second.Reused || !strings.HasPrefix(second.Reason, "snapshot "+first.SnapshotID) {
		t.Errorf("second name: reused %t, %q; want a new AMI, saying which snapshot it reused and why", second.Reused, second.Reason)
	}
}

// A file that is not what its metadata says is refused after the upload has read it, and
// its snapshot deleted; an image of another format is refused at once.
func TestPublishAWSRefuses(t *testing.T) {
	f, a := newFakeAWS(t)
	dir := t.TempDir()
	path, _ := publishtest.RawImage(t, dir, testDiskSize, scattered())
	im, _ := publish.Load(path)
	fh, _ := os.OpenFile(path, os.O_WRONLY, 0)
	fh.WriteAt([]byte("changed"), 30*blockSize)
	fh.Close()
	_, err := a.publish(context.Background(), im, newRequest())
	if err == nil || !strings.Contains(err.Error(), "the file changed after the bake") {
		t.Fatalf("publish of a changed file = %v", err)
	}
	if s, i := f.Count(testRegion); s != 0 || i != 0 {
		t.Errorf("%d snapshots, %d images left", s, i)
	}
	im.Output.Format = "vmdk"
	if _, err := a.publish(context.Background(), im, newRequest()); err == nil || !strings.Contains(err.Error(), "publish the .raw output") {
		t.Errorf("publish of a vmdk = %v", err)
	}
}
