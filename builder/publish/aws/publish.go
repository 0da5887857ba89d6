// Package aws publishes raw bake outputs as AMIs (publish.Publisher): the disk goes through the
// EBS direct APIs into a snapshot (zero blocks skipped, blocks in parallel), an AMI is
// registered from it and shared and copied as the Request asks. A second publish of the same
// file finds the AMI, or a snapshot, by its kiln:sha256 tag, and takes it only when it is the
// caller's account's and its blocks, read back, are the file's.
package aws

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"regexp"
	"slices"
	"strings"
	"time"

	sdkaws "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/ratelimit"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/service/ebs"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/aws-sdk-go-v2/service/sts"

	"github.com/kilnproject/kiln/builder/publish"
)

var _ publish.Publisher = (*Publisher)(nil)

// DigestTag is the tag on every snapshot and AMI kiln publishes: the hex SHA-256 of the raw
// image, the identity by which a second publish finds them.
const DigestTag = "kiln:sha256"

// ProvenanceTag is the tag kiln publish --key adds beside DigestTag: the hex SHA-256 of the
// signed provenance (<image>-<role>.intoto.jsonl) the image was checked against.
const ProvenanceTag = "kiln:provenance-sha256"

// Publisher publishes raw images as AMIs in one region of one account.
type Publisher struct {
	// Request is what Publish publishes the image as.
	Request Request
	Region  string
	EBS     *ebs.Client
	EC2     *ec2.Client
	STS     *sts.Client // says which account the credentials are of
	// EC2In returns the EC2 client of another region, where images are copied to.
	EC2In func(region string) *ec2.Client
	// Workers is how many blocks are uploaded at once (0: 12).
	Workers int
	// Poll is how often a wait for a snapshot or an image looks (0: 5s); MaxWait bounds each
	// wait (0: one hour).
	Poll, MaxWait time.Duration
	// Progress, when set, is called while blocks upload, from one goroutine at a time.
	Progress func(UploadProgress)
	Log      *slog.Logger
}

// Config says how New makes its clients.
type Config struct {
	Config sdkaws.Config // credentials, region, HTTP client: config.LoadDefaultConfig's
	// Endpoint, when set, is the URL of EBS, EC2 and STS in every region (an emulator or a
	// private endpoint); otherwise each client resolves its own (AWS_ENDPOINT_URL_EBS,
	// AWS_ENDPOINT_URL_EC2 and AWS_ENDPOINT_URL_STS are read by the SDK).
	Endpoint string
	// InsecureHTTP lets calls go to an http:// endpoint, their signatures and session token in
	// clear text (an emulator on loopback); without it every call to one fails unsent.
	InsecureHTTP bool
	// MaxAttempts and MaxBackoff bound the retries of a failed call (0: 10 attempts, 20s).
	MaxAttempts int
	MaxBackoff  time.Duration
}

// New returns a publisher for c.Config.Region whose clients retry throttling, 5xx
// answers and broken connections with the SDK's standard retryer: enough attempts for an
// upload of thousands of blocks, and no retry quota, which parallel uploads would drain.
func New(c Config) *Publisher {
	attempts, backoff := c.MaxAttempts, c.MaxBackoff
	if attempts == 0 {
		attempts = 10
	}
	if backoff == 0 {
		backoff = 20 * time.Second
	}
	cfg := c.Config.Copy()
	cfg.Retryer = func() sdkaws.Retryer {
		return retry.NewStandard(func(o *retry.StandardOptions) {
			o.MaxAttempts, o.MaxBackoff, o.RateLimiter = attempts, backoff, ratelimit.None
		})
	}
	if !c.InsecureHTTP {
		cfg.APIOptions = append(cfg.APIOptions[:len(cfg.APIOptions):len(cfg.APIOptions)], addRefusePlainHTTP)
	}
	var endpoint *string
	if c.Endpoint != "" {
		endpoint = sdkaws.String(c.Endpoint)
	}
	ec2In := func(region string) *ec2.Client {
		return ec2.NewFromConfig(cfg, func(o *ec2.Options) {
			o.Region = region
			if endpoint != nil {
				o.BaseEndpoint = endpoint
			}
		})
	}
	return &Publisher{
		Region: cfg.Region,
		EBS: ebs.NewFromConfig(cfg, func(o *ebs.Options) {
			if endpoint != nil {
				o.BaseEndpoint = endpoint
			}
		}),
		EC2: ec2In(cfg.Region),
		STS: sts.NewFromConfig(cfg, func(o *sts.Options) {
			if endpoint != nil {
				o.BaseEndpoint = endpoint
			}
		}),
		EC2In: ec2In,
	}
}

// Request is what to publish an image as.
type Request struct {
	Name      string            // the AMI's name, in every region
	Tags      map[string]string // on the snapshots and AMIs, beside kiln:sha256
	ShareWith []string          // account ids allowed to launch the AMI (and its copies)
	CopyTo    []string          // regions the AMI is copied to
}

// Result is what a publish made or found; its JSON is what `kiln publish aws -o json` prints.
type Result struct {
	ImageID    string            `json:"imageId"`
	SnapshotID string            `json:"snapshotId"`
	Region     string            `json:"region"`
	Copies     map[string]string `json:"copies"`
	Reused     bool              `json:"reused"` // the AMI existed: nothing was uploaded or registered
	// Reason says what was reused (the AMI, or a snapshot an AMI was registered from) and
	// why kiln took it for this file; empty when nothing was.
	Reason string `json:"reason,omitempty"`
	// Provenance is the hex SHA-256 of the signed provenance the file was checked against
	// (kiln publish --key), tagged ProvenanceTag on what this run made; empty without a key.
	Provenance string `json:"provenance,omitempty"`
	// Upload is the upload's account, nil when nothing was uploaded.
	Upload *UploadProgress `json:"-"`
}

// WriteText writes the result as kiln publish aws prints it: the AMI and its snapshot, why
// one was reused, the copies by region, and the upload's figures (publish.Result).
func (res *Result) WriteText(w io.Writer) error {
	how := "registered"
	if res.Reused {
		how = "found (nothing uploaded)"
	}
	fmt.Fprintf(w, "%s\t%s\tsnapshot %s\t%s\n", res.Region, res.ImageID, res.SnapshotID, how)
	if res.Reason != "" {
		fmt.Fprintf(w, "reused: %s\n", res.Reason)
	}
	if res.Provenance != "" {
		fmt.Fprintf(w, "provenance verified: sha256:%s\n", res.Provenance)
	}
	for _, r := range slices.Sorted(maps.Keys(res.Copies)) {
		fmt.Fprintf(w, "%s\t%s\tcopy\n", r, res.Copies[r])
	}
	if u := res.Upload; u != nil {
		fmt.Fprintf(w, "uploaded %d blocks (%d MiB) in %s, %.1f MiB/s; %d zero blocks skipped\n",
			u.Uploaded, u.Bytes>>20, u.Elapsed.Round(time.Second), u.MiBps(), u.Skipped)
	}
	return nil
}

var (
	amiName   = regexp.MustCompile(`^[A-Za-z0-9()\[\] ./'@_-]{3,128}$`)
	accountID = regexp.MustCompile(`^[0-9]{12}$`)
	region    = regexp.MustCompile(`^[a-z]{2}(-[a-z]+)+-[0-9]+$`)
)

// A RequestError is a field of an Request (or the home region) that EC2 would refuse.
type RequestError struct {
	Field string // region, name, tag, share-with or copy-to
	Err   error
}

func (e *RequestError) Error() string { return e.Field + ": " + e.Err.Error() }
func (e *RequestError) Unwrap() error { return e.Err }

func badField(field, format string, a ...any) error {
	return &RequestError{Field: field, Err: fmt.Errorf(format, a...)}
}

// Validate checks r the way EC2 would, before anything is uploaded; home is the region the
// image is published in.
func (r Request) Validate(home string) error {
	if !region.MatchString(home) {
		return badField("region", "%q: not a region name (like eu-west-1)", home)
	}
	if !amiName.MatchString(r.Name) {
		return badField("name", "%q: an AMI name is 3-128 letters, digits, spaces and ()[]./'@_-", r.Name)
	}
	for k, v := range r.Tags {
		if k == DigestTag || k == ProvenanceTag {
			return badField("tag", "%s is kiln's own tag", k)
		}
		if len(k) == 0 || len(k) > 128 || len(v) > 256 || strings.HasPrefix(k, "aws:") {
			return badField("tag", "%q: keys are 1-128 characters, not starting aws:, values up to 256", k)
		}
	}
	for _, a := range r.ShareWith {
		if !accountID.MatchString(a) {
			return badField("share-with", "%q: not a 12-digit AWS account id", a)
		}
	}
	for _, rg := range r.CopyTo {
		if !region.MatchString(rg) {
			return badField("copy-to", "%q: not a region name (like eu-west-1)", rg)
		}
		if rg == home {
			return badField("copy-to", "%s: that is the region the image is published in", rg)
		}
	}
	return nil
}

// Publish makes im an AMI called a.Request.Name, or finds the AMI an earlier publish of the
// same file made; then it shares it and copies it as a.Request asks (publish.Publisher). The
// result is a *Result.
func (a *Publisher) Publish(ctx context.Context, im *publish.Image) (publish.Result, error) {
	res, err := a.publish(ctx, im, a.Request)
	if err != nil {
		return nil, err
	}
	return res, nil
}

// publish makes im an AMI called r.Name, or finds the AMI an earlier publish of the same file
// made; then it shares it and copies it as r asks. The file is hashed against its metadata
// before any request. Nothing is uploaded when the AMI, or a completed snapshot of the file,
// exists already and is the caller's and holds exactly the file's bytes (read back to check).
func (a *Publisher) publish(ctx context.Context, im *publish.Image, r Request) (*Result, error) {
	if im.Format() != "raw" {
		return nil, fmt.Errorf("publish aws: %s is a %s image; publish the .raw output of the bake", im.Path, im.Format())
	}
	if err := r.Validate(a.Region); err != nil {
		return nil, fmt.Errorf("publish aws: %w", err)
	}
	sums, err := hashRaw(im)
	if err != nil {
		return nil, err
	}
	account, err := a.callerAccount(ctx)
	if err != nil {
		return nil, err
	}
	res := &Result{Region: a.Region, Copies: map[string]string{}, Provenance: im.ProvenanceSHA256()}
	img, err := a.findImage(ctx, a.EC2, a.Region, account, r.Name, im.SHA256)
	if err != nil {
		return nil, err
	}
	if img != nil {
		snap, err := a.checkAMI(ctx, img, account, im, sums)
		if err != nil {
			return nil, nameHeld(r.Name, a.Region, img, err)
		}
		a.log().Info("publish aws: image exists and holds this file", "image", *img.ImageId, "region", a.Region)
		if p := im.ProvenanceSHA256(); p != "" && tagValue(img.Tags, ProvenanceTag) != p {
			a.log().Warn("publish aws: the AMI found keeps the provenance tag it was published with; this run's checked provenance is not recorded on it",
				"image", *img.ImageId, "tag", ProvenanceTag, "has", tagValue(img.Tags, ProvenanceTag), "checked", p)
		}
		res.ImageID, res.SnapshotID, res.Reused = *img.ImageId, snap, true
		res.Reason = fmt.Sprintf("AMI %s is called %q in %s, owned by the caller's account %s, tagged %s=%s and registered as kiln registers AMIs; its snapshot %s, the caller's, read back holds exactly the %d data blocks of %s",
			*img.ImageId, r.Name, a.Region, account, DigestTag, im.SHA256, snap, len(sums.blocks), im.Path)
	} else if err := a.create(ctx, im, sums, account, r, res); err != nil {
		return nil, err
	}
	if err := a.share(ctx, a.EC2, a.Region, res.ImageID, res.SnapshotID, r.ShareWith); err != nil {
		return nil, fmt.Errorf("publish aws: image %s is registered in %s, but: %w", res.ImageID, a.Region, err)
	}
	if err := a.copyAll(ctx, im, account, r, res); err != nil {
		return nil, err
	}
	return res, nil
}

// nameHeld is the error of an AMI called name, tagged with the image's digest, that err says
// is not this image.
func nameHeld(name, region string, img *types.Image, err error) error {
	var ni *notImageError
	if !errors.As(err, &ni) {
		return err
	}
	id := sdkaws.ToString(img.ImageId)
	return fmt.Errorf("publish aws: the name %q is held in %s by %s, tagged %s with this image's digest, but %w: deregister it or choose another --name",
		name, region, id, DigestTag, err)
}

// create uploads im (unless a completed snapshot of the account's holds it) and registers
// the AMI.
func (a *Publisher) create(ctx context.Context, im *publish.Image, sums *rawSums, account string, r Request, res *Result) error {
	snap, err := a.findSnapshot(ctx, im, account, sums)
	if err != nil {
		return err
	}
	made := snap == ""
	if made {
		up, err := a.upload(ctx, im, r)
		if err != nil {
			return err
		}
		snap, res.Upload = up.SnapshotID, &up.Progress
	} else {
		a.log().Info("publish aws: a snapshot of the account holds this file, registering it", "snapshot", snap)
		res.Reason = fmt.Sprintf("snapshot %s in %s, owned by the caller's account %s, read back holds exactly the %d data blocks of %s; the AMI was registered from it",
			snap, a.Region, account, len(sums.blocks), im.Path)
	}
	res.SnapshotID = snap
	id, err := a.register(ctx, im, r, snap, account)
	if err != nil {
		if made {
			return a.undo(ctx, a.EC2, a.Region, err, "", snap)
		}
		return err
	}
	res.ImageID = id
	return nil
}

// tags is r's tags with the digest tag and, for an image whose provenance was checked, the
// provenance tag, sorted by key.
func (r Request) tags(im *publish.Image) []kv {
	all := maps.Clone(r.Tags)
	if all == nil {
		all = map[string]string{}
	}
	all[DigestTag] = im.SHA256
	if p := im.ProvenanceSHA256(); p != "" {
		all[ProvenanceTag] = p
	}
	var out []kv
	for _, k := range slices.Sorted(maps.Keys(all)) {
		out = append(out, kv{k, all[k]})
	}
	return out
}

type kv struct{ key, value string }

func (a *Publisher) log() *slog.Logger {
	if a.Log != nil {
		return a.Log
	}
	return slog.Default()
}

func (a *Publisher) poll() time.Duration {
	if a.Poll > 0 {
		return a.Poll
	}
	return 5 * time.Second
}

func (a *Publisher) workers() int {
	if a.Workers > 0 {
		return a.Workers
	}
	return 12
}

func (a *Publisher) maxWait() time.Duration {
	if a.MaxWait > 0 {
		return a.MaxWait
	}
	return time.Hour
}
