package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/spf13/cobra"

	"github.com/kilnproject/kiln/builder/publish"
	"github.com/kilnproject/kiln/builder/publish/aws"
	"github.com/kilnproject/kiln/internal/exitcode"
)

// publishAWSLong is `kiln publish aws --help`.
const publishAWSLong = `Publish aws uploads the raw output of a bake through the EBS direct APIs (no S3 bucket, no VM
import role): every 512 KiB block that is not all zeros is put, in parallel, with its SHA-256,
and the snapshot is completed with the blocks' aggregate checksum. The file is checked against
the SHA-256 in its metadata (<image>-<role>.json beside it) as it is read. kiln then waits for
the snapshot and registers the AMI: UEFI boot, ENA, IMDSv2 required, x86_64, the root device
/dev/xvda a gp3 volume of the disk's size, deleted on termination.

The file is hashed and checked against its metadata before any request: a file that is not
what its metadata says is refused, naming both digests. The snapshot and the AMI are tagged
kiln:sha256=<the file's SHA-256> (and with each --tag), but a tag is not trusted: publishing
again reuses the AMI of that name only if it is owned by the caller's account (from STS
GetCallerIdentity, checked by kiln, not left to the endpoint's Owner=self), registered as
kiln registers AMIs, and its snapshot, also the caller's, read back through the EBS direct
APIs holds exactly the file's blocks; a copy in another region is reused only if EC2 says it
is a copy of that AMI. A completed snapshot of the caller's that holds the file (read back
the same way) is reused under a new name; a tagged snapshot that does not, or of another
account, is passed over. A name held by another image, or by an AMI that fails these
checks, is an error. --share-with lets an account launch the AMI (and
create volumes from its snapshot); --copy-to copies it into another region, tagged and
shared the same way; both are applied again to an AMI found, so a publish that failed
part-way is finished by running it again.

A failure deletes what the run created (the snapshot, an AMI that did not become
available) or names what is left. Throttling, 5xx answers and broken connections are
retried; a RegisterImage whose answer was lost is found again by its name and snapshot, and
CopyImage carries a client token. Credentials come from the AWS SDK's default chain
(environment, shared config and SSO profiles, web identity as in GitHub Actions OIDC,
instance and container roles); refused credentials (AuthFailure, an expired token) are said
to be so. --endpoint-url sends EBS, EC2 and STS calls to another URL (an emulator or a
private endpoint); AWS_ENDPOINT_URL_EBS, AWS_ENDPOINT_URL_EC2 and AWS_ENDPOINT_URL_STS set
one service's. An http:// endpoint, from the flag or the environment, is refused before
anything is sent (the signature and session token would go in clear text) unless
--insecure-http is given; so is a --region that is not a region name (like eu-west-1).

-o json prints {"imageId","snapshotId","region","copies":{region: id},"reused","reason",
"provenance"} for the next CI step; "reason", present when an AMI or a snapshot was reused,
names it and says why kiln took it for this file; "provenance", with --key, is the SHA-256
of the signed provenance checked (see kiln publish --help).`

// publishAWSExample is `kiln publish aws`'s examples.
const publishAWSExample = `  kiln publish aws out/aws-worker.raw --region eu-west-1 --name kiln-aws-worker-$(date +%Y%m%d)
  kiln publish aws out/aws-worker.raw --region eu-west-1 --name kiln-worker-v1.2.0 --key release.pub
  kiln publish aws out/aws-worker.raw --region eu-west-1 --name kiln-worker-v1.2.0 \
      --tag team=platform --share-with 123456789012 --copy-to us-east-1 -o json

  # against a local emulator that speaks plain http
  kiln publish aws out/aws-worker.raw --region eu-west-1 --name kiln-test \
      --endpoint-url http://127.0.0.1:4566 --insecure-http`

// publishAWSOptions are `kiln publish aws`'s flags.
type publishAWSOptions struct {
	region, name, format, endpoint string
	key                            string
	tags, shareWith, copyTo        []string
	insecureHTTP                   bool
}

func newPublishAWSCmd() *cobra.Command {
	var p publishAWSOptions
	cmd := &cobra.Command{
		Use:     "aws IMAGE.raw --region REGION --name NAME",
		Short:   "Upload a raw image into an EBS snapshot and register it as an AMI",
		Long:    publishAWSLong,
		Example: publishAWSExample,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return p.run(cmd, args[0])
		},
	}
	f := cmd.Flags()
	f.StringVar(&p.region, "region", "", "the region to publish in (required)")
	f.StringVar(&p.name, "name", "", "the AMI's name, in every region (required)")
	f.StringArrayVar(&p.tags, "tag", nil, "K=V: a tag on the snapshot and the AMIs (repeatable)")
	f.StringArrayVar(&p.shareWith, "share-with", nil, "an account id allowed to launch the AMI (repeatable)")
	f.StringArrayVar(&p.copyTo, "copy-to", nil, "a region to copy the AMI to (repeatable)")
	f.StringVarP(&p.format, "output", "o", "table", "output format: table or json")
	f.StringVar(&p.endpoint, "endpoint-url", "", "the URL of EBS, EC2 and STS (an emulator or a private endpoint)")
	keyFlag(cmd, &p.key)
	f.BoolVar(&p.insecureHTTP, "insecure-http", false, "allow an http:// endpoint, the signatures and session token in clear text (emulators only)")
	_ = cmd.MarkFlagRequired("region")
	_ = cmd.MarkFlagRequired("name")
	return cmd
}

// run checks the flags and publishes the raw image at file as an AMI.
func (p *publishAWSOptions) run(cmd *cobra.Command, file string) error {
	if p.format != "table" && p.format != "json" {
		return exitcode.Usagef("-o: unknown output format %q (want table or json)", p.format)
	}
	req, err := awsRequest(p.name, p.region, p.tags, p.shareWith, p.copyTo)
	if err != nil {
		return err
	}
	if err := checkEndpoint(p.endpoint, p.insecureHTTP, "--insecure-http"); err != nil {
		return exitcode.Usagef("--endpoint-url: %v", err)
	}
	im, err := publish.Load(file)
	if err != nil {
		return err
	}
	if im.Format() != "raw" {
		return exitcode.Usagef("%s is a %s image: publish the .raw output of the bake", file, im.Format())
	}
	if err := verifyBeforePublish(im, p.key); err != nil {
		return err
	}
	cfg, err := config.LoadDefaultConfig(cmd.Context(), config.WithRegion(p.region))
	if err != nil {
		return fmt.Errorf("publish aws: AWS configuration: %w", err)
	}
	a := aws.New(aws.Config{Config: cfg, Endpoint: p.endpoint, InsecureHTTP: p.insecureHTTP})
	a.Request, a.Log = req, slog.Default()
	a.Progress = newProgress(cmd.ErrOrStderr(), a.Log)
	return publishTo(cmd, a, im, p.format)
}

// awsRequest makes the publish request of the flags, refusing bad ones as usage errors
// naming the flag.
func awsRequest(name, region string, tags, shareWith, copyTo []string) (aws.Request, error) {
	req := aws.Request{Name: name, Tags: map[string]string{}, ShareWith: shareWith, CopyTo: copyTo}
	for _, t := range tags {
		k, v, ok := strings.Cut(t, "=")
		if !ok || k == "" {
			return req, exitcode.Usagef("--tag %q: want KEY=VALUE", t)
		}
		if _, dup := req.Tags[k]; dup {
			return req, exitcode.Usagef("--tag %q: the key %s is given twice", t, k)
		}
		req.Tags[k] = v
	}
	if err := req.Validate(region); err != nil {
		var re *aws.RequestError
		if errors.As(err, &re) {
			return req, exitcode.Usagef("--%s %v", re.Field, re.Err)
		}
		return req, err
	}
	return req, nil
}

// newProgress shows an upload's progress: one line rewritten on a terminal, otherwise a
// log line every 15 seconds and at the end.
func newProgress(w io.Writer, log *slog.Logger) func(aws.UploadProgress) {
	tty := isTerminal(w)
	var mu sync.Mutex
	var last time.Time
	return func(p aws.UploadProgress) {
		mu.Lock()
		defer mu.Unlock()
		done := p.Uploaded + p.Skipped
		if tty {
			fmt.Fprintf(w, "\rblocks %d/%d: %d put, %d zero skipped, %.1f MiB/s ", done, p.Blocks, p.Uploaded, p.Skipped, p.MiBps())
			if p.Last {
				fmt.Fprintln(w)
			}
			return
		}
		if p.Last || time.Since(last) >= 15*time.Second {
			last = time.Now()
			log.Info("publish aws: upload", "blocks", p.Blocks, "put", p.Uploaded, "skipped", p.Skipped, "MiB/s", fmt.Sprintf("%.1f", p.MiBps()), "done", p.Done)
		}
	}
}
