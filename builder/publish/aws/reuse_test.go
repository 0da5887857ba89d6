package aws

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	sdkaws "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"

	"github.com/kilnproject/kiln/builder/publish"
	"github.com/kilnproject/kiln/builder/publish/publishtest"
)

// blocksOf is what a snapshot of content holds: its blocks that are not all zeros, by index.
func blocksOf(content []byte) map[int32][]byte {
	blocks := map[int32][]byte{}
	zero := make([]byte, blockSize)
	for i := 0; i*blockSize < len(content); i++ {
		b := make([]byte, blockSize)
		copy(b, content[i*blockSize:])
		if !bytes.Equal(b, zero) {
			blocks[int32(i)] = b
		}
	}
	return blocks
}

// changed is blocksOf(content) with one byte of block 33 changed.
func changed(content []byte) map[int32][]byte {
	blocks := blocksOf(content)
	blocks[33][100] ^= 0xff
	return blocks
}

// A file that is not what its sidecar says is refused before any request, even when an AMI of
// the sidecar's digest exists: it is never answered as reused.
func TestPublishAWSHashesFirst(t *testing.T) {
	f, a := newFakeAWS(t)
	path, _ := publishtest.RawImage(t, t.TempDir(), testDiskSize, scattered())
	im, _ := publish.Load(path)
	if _, err := a.publish(context.Background(), im, newRequest()); err != nil {
		t.Fatal(err)
	}
	fh, _ := os.OpenFile(path, os.O_WRONLY, 0)
	fh.WriteAt([]byte("not what was baked"), 3*blockSize)
	fh.Close()
	calls := f.AllCalls()
	res, err := a.publish(context.Background(), im, newRequest())
	if err == nil || !strings.Contains(err.Error(), "the file changed after the bake") {
		t.Fatalf("publish of a file that differs from its sidecar = %+v, %v; want refused", res, err)
	}
	if n := f.AllCalls() - calls; n != 0 {
		t.Errorf("%d AWS calls made for a file that differs from its sidecar, want none", n)
	}
}

// What another principal left tagged with the image's digest is reused only when kiln can tie
// it to the file's bytes: a snapshot or AMI of another content, of another account, or an AMI
// not registered as kiln registers them is never answered as this image.
func TestPublishAWSReuseChecks(t *testing.T) {
	const other = "999988887777"
	good := func(t *testing.T, a *Publisher, im *publish.Image) string { // a first publish's snapshot, under another name
		req := newRequest()
		req.Name = "kiln-aws-worker-first"
		res, err := a.publish(context.Background(), im, req)
		if err != nil {
			t.Fatal(err)
		}
		return res.SnapshotID
	}
	for _, tc := range []struct {
		name   string
		plant  func(t *testing.T, f *publishtest.AWS, a *Publisher, im *publish.Image, content []byte) string // the id planted
		copyTo string
		want   string // error substring; "" publishes without reusing what was planted
	}{
		{name: "snapshot of other bytes", plant: func(t *testing.T, f *publishtest.AWS, _ *Publisher, im *publish.Image, _ []byte) string {
			return f.PutSnapshot(testRegion, publishtest.Snapshot{GiB: 1, Tags: map[string]string{DigestTag: im.SHA256}, Blocks: map[int32][]byte{0: randBytes(blockSize)}})
		}},
		{name: "snapshot with a block changed", plant: func(t *testing.T, f *publishtest.AWS, _ *Publisher, im *publish.Image, content []byte) string {
			return f.PutSnapshot(testRegion, publishtest.Snapshot{GiB: 1, Tags: map[string]string{DigestTag: im.SHA256}, Blocks: changed(content)})
		}},
		{name: "snapshot lacking a block", plant: func(t *testing.T, f *publishtest.AWS, _ *Publisher, im *publish.Image, content []byte) string {
			blocks := blocksOf(content)
			delete(blocks, 33)
			return f.PutSnapshot(testRegion, publishtest.Snapshot{GiB: 1, Tags: map[string]string{DigestTag: im.SHA256}, Blocks: blocks})
		}},
		{name: "snapshot of another account, listed by an endpoint ignoring Owner=self", plant: func(t *testing.T, f *publishtest.AWS, _ *Publisher, im *publish.Image, content []byte) string {
			f.AnyOwner()
			return f.PutSnapshot(testRegion, publishtest.Snapshot{GiB: 1, Owner: other, Tags: map[string]string{DigestTag: im.SHA256}, Blocks: blocksOf(content)})
		}},
		{name: "AMI of the name over other bytes", want: "but snapshot snap-00000000000000001 is not what kiln makes of this file: block 33 differs from the file's",
			plant: func(t *testing.T, f *publishtest.AWS, _ *Publisher, im *publish.Image, content []byte) string {
				snap := f.PutSnapshot(testRegion, publishtest.Snapshot{GiB: 1, Tags: map[string]string{DigestTag: im.SHA256}, Blocks: changed(content)})
				return f.PutImage(testRegion, publishtest.Image{Name: "kiln-aws-worker", SnapshotID: snap, GiB: 1, Tags: map[string]string{DigestTag: im.SHA256}})
			}},
		{name: "AMI of the name of another account, listed by an endpoint ignoring Owner=self", plant: func(t *testing.T, f *publishtest.AWS, a *Publisher, im *publish.Image, _ []byte) string {
			f.AnyOwner()
			return f.PutImage(testRegion, publishtest.Image{Name: "kiln-aws-worker", Owner: other, SnapshotID: good(t, a, im), GiB: 1, Tags: map[string]string{DigestTag: im.SHA256}})
		}},
		{name: "AMI of the file's snapshot without IMDSv2", want: `IMDS support ""`, plant: func(t *testing.T, f *publishtest.AWS, a *Publisher, im *publish.Image, _ []byte) string {
			return f.PutImage(testRegion, publishtest.Image{Name: "kiln-aws-worker", SnapshotID: good(t, a, im), GiB: 1, Tags: map[string]string{DigestTag: im.SHA256},
				Attrs: map[string]string{"BootMode": "uefi", "Architecture": "x86_64"}})
		}},
		{name: "AMI of the name in the copy region, not a copy", copyTo: "us-east-1", want: "is held in us-east-1 by ami-",
			plant: func(t *testing.T, f *publishtest.AWS, _ *Publisher, im *publish.Image, content []byte) string {
				snap := f.PutSnapshot("us-east-1", publishtest.Snapshot{GiB: 1, Tags: map[string]string{DigestTag: im.SHA256}, Blocks: blocksOf(content)})
				return f.PutImage("us-east-1", publishtest.Image{Name: "kiln-aws-worker", SnapshotID: snap, GiB: 1, Tags: map[string]string{DigestTag: im.SHA256}})
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, a := newFakeAWS(t)
			path, content := publishtest.RawImage(t, t.TempDir(), testDiskSize, scattered())
			im, _ := publish.Load(path)
			planted := tc.plant(t, f, a, im, content)
			req := newRequest()
			if tc.copyTo != "" {
				req.CopyTo = []string{tc.copyTo}
			}
			res, err := a.publish(context.Background(), im, req)
			if tc.want != "" {
				if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), planted) {
					t.Fatalf("publish = %+v, %v; want an error naming %s with %q", res, err, planted, tc.want)
				}
				t.Log(err)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if res.Reused || res.ImageID == planted || res.SnapshotID == planted {
				t.Errorf("publish = %+v: reused %s, planted by another principal", res, planted)
			}
			checkSnapshot(t, f, testRegion, res.SnapshotID, content)
		})
	}
}

// A call whose answer is lost is retried, and the retry answers what the first call made: the
// AMI RegisterImage registered (found by its name and snapshot), the copy CopyImage made (by
// its client token). Nothing is made twice, nothing is named as left over.
func TestPublishAWSLostAnswers(t *testing.T) {
	for _, op := range []string{"RegisterImage", "CopyImage"} {
		t.Run(op, func(t *testing.T) {
			f, a := newFakeAWS(t, publishtest.Fault{Op: op, Times: 1, Lost: true})
			path, content := publishtest.RawImage(t, t.TempDir(), testDiskSize, scattered())
			im, _ := publish.Load(path)
			req := newRequest()
			req.CopyTo = []string{"us-east-1"}
			res, err := a.publish(context.Background(), im, req)
			if err != nil {
				t.Fatal(err)
			}
			checkSnapshot(t, f, testRegion, res.SnapshotID, content)
			if f.Calls(op) != 2 || len(f.Unspent()) != 0 {
				t.Errorf("%d %s calls, want the lost one and its retry", f.Calls(op), op)
			}
			for region, id := range map[string]string{testRegion: res.ImageID, "us-east-1": res.Copies["us-east-1"]} {
				if s, i := f.Count(region); i != 1 || s != 1 || f.Image(region, id) == nil {
					t.Errorf("%s holds %d images and %d snapshots, want one of each, the image %s", region, i, s, id)
				}
			}
		})
	}
}

// cancelAfter cancels a context when the nth block is put through it.
type cancelAfter struct {
	rt     http.RoundTripper
	n      int32
	puts   atomic.Int32
	cancel context.CancelFunc
}

func (c *cancelAfter) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method == http.MethodPut && strings.Contains(r.URL.Path, "/blocks/") && c.puts.Add(1) == c.n {
		c.cancel()
	}
	return c.rt.RoundTrip(r)
}

// The last progress report of an upload says whether every block was put: not when the
// publish was cancelled part-way.
func TestPublishAWSProgressEnd(t *testing.T) {
	for _, cancelled := range []bool{false, true} {
		t.Run(map[bool]string{false: "finished", true: "cancelled"}[cancelled], func(t *testing.T) {
			f := publishtest.NewAWS(t)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			n := int32(1 << 30)
			if cancelled {
				n = 3
			}
			a := fakePublisher(f, &http.Client{Transport: &cancelAfter{rt: f.Client().Transport, n: n, cancel: cancel}})
			var reports []UploadProgress
			a.Progress = func(p UploadProgress) { reports = append(reports, p) }
			path, _ := publishtest.RawImage(t, t.TempDir(), testDiskSize, scattered())
			im, _ := publish.Load(path)
			_, err := a.publish(ctx, im, newRequest())
			if cancelled != (err != nil) {
				t.Fatalf("publish (cancelled %t) = %v", cancelled, err)
			}
			if len(reports) == 0 {
				t.Fatal("no progress reported")
			}
			last := reports[len(reports)-1]
			if !last.Last || last.Done == cancelled || cancelled && last.Uploaded == last.Blocks-last.Skipped {
				t.Errorf("last report %+v of an upload cancelled %t", last, cancelled)
			}
		})
	}
}

// When the name is taken between kiln's lookup and its RegisterImage, the AMI holding it is
// adopted only when it was registered from the snapshot this run uploaded: one another
// principal registered from another snapshot, tagged with the same digest, is an error naming
// it, and the snapshot this run made is deleted.
func TestPublishAWSRegisterRace(t *testing.T) {
	f := publishtest.NewAWS(t)
	path, content := publishtest.RawImage(t, t.TempDir(), testDiskSize, scattered())
	im, _ := publish.Load(path)
	theirs := f.PutSnapshot(testRegion, publishtest.Snapshot{GiB: 1, Tags: map[string]string{DigestTag: "planted"}, Blocks: blocksOf(content)})
	f.Inject(publishtest.Fault{Op: "RegisterImage", Times: 1, Plant: &publishtest.Image{
		Name: "kiln-aws-worker", SnapshotID: theirs, GiB: 1, Tags: map[string]string{DigestTag: im.SHA256}}})
	a := fakePublisher(f, f.Client())
	res, err := a.publish(context.Background(), im, newRequest())
	if err == nil || !strings.Contains(err.Error(), `RegisterImage in eu-west-1: the name "kiln-aws-worker" is taken`) ||
		!strings.Contains(err.Error(), "it was registered from snapshot "+theirs) {
		t.Fatalf("publish = %+v, %v; want the AMI of %s refused", res, err, theirs)
	}
	if s, i := f.Count(testRegion); s != 1 || i != 1 {
		t.Errorf("%d snapshots and %d images, want only the planted ones: the run's snapshot deleted", s, i)
	}
}

// An http:// endpoint, whichever way it is given, gets no call: the signature and the
// session token would go in clear text. InsecureHTTP lets them go, for an emulator.
func TestPublishAWSPlainHTTP(t *testing.T) {
	for _, insecure := range []bool{false, true} {
		t.Run(map[bool]string{false: "refused", true: "insecure-http"}[insecure], func(t *testing.T) {
			f := publishtest.NewPlainAWS(t)
			a := New(Config{
				Config: sdkaws.Config{
					Region:      testRegion,
					Credentials: credentials.NewStaticCredentialsProvider(publishtest.AWSAccessKeyID, publishtest.AWSSecretAccessKey, publishtest.AWSSessionToken),
					HTTPClient:  f.Client(),
				},
				Endpoint:     f.URL(),
				InsecureHTTP: insecure,
				MaxBackoff:   20 * time.Millisecond,
			})
			a.Poll, a.MaxWait = time.Millisecond, 10*time.Second
			a.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
			path, content := publishtest.RawImage(t, t.TempDir(), testDiskSize, scattered())
			im, _ := publish.Load(path)
			res, err := a.publish(context.Background(), im, newRequest())
			if insecure {
				if err != nil {
					t.Fatal(err)
				}
				checkSnapshot(t, f, testRegion, res.SnapshotID, content)
				return
			}
			var pe *PlainHTTPError
			if !errors.As(err, &pe) || pe.Endpoint != f.URL() {
				t.Fatalf("publish to %s = %+v, %v; want a PlainHTTPError", f.URL(), res, err)
			}
			if n := f.AllCalls(); n != 0 {
				t.Errorf("%d calls reached the plain-http endpoint", n)
			}
		})
	}
}

// The home region is checked like the regions copied to, before anything is sent.
func TestAWSRequestRegion(t *testing.T) {
	for _, tc := range []struct {
		region string
		ok     bool
	}{
		{"eu-west-1", true}, {"us-gov-west-1", true}, {"ap-southeast-2", true},
		{"", false}, {"EU-WEST-1", false}, {"eu-west", false}, {"mars", false}, {"eu-west-1/", false}, {"https://eu-west-1", false},
	} {
		err := newRequest().Validate(tc.region)
		var re *RequestError
		if tc.ok != (err == nil) || !tc.ok && (!errors.As(err, &re) || re.Field != "region") {
			t.Errorf("Validate(%q) = %v, want ok %t (a region error otherwise)", tc.region, err, tc.ok)
		}
	}
}
