package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/spf13/cobra"

	"github.com/kilnproject/kiln/builder/publish"
	"github.com/kilnproject/kiln/internal/exitcode"
)

func newPublishAWSCmd() *cobra.Command {
	var region, name, format, endpoint string
	var tags, shareWith, copyTo []string
	cmd := &cobra.Command{
		Use:   "aws IMAGE.raw --region REGION --name NAME",
		Short: "Upload a raw image into an EBS snapshot and register it as an AMI",
		Long: `Publish aws uploads the raw output of a bake through the EBS direct APIs (no S3 bucket, no VM
import role): every 512 KiB block that is not all zeros is put, in parallel, with its SHA-256,
and the snapshot is completed with the blocks' aggregate checksum. The file is checked against
the SHA-256 in its metadata (<image>-<role>.json beside it) as it is read. kiln then waits for
the snapshot and registers the AMI: UEFI boot, ENA, IMDSv2 required, x86_64, the root device
/dev/xvda a gp3 volume of the disk's size, deleted on termination.

The snapshot and the AMI are tagged kiln:sha256=<the file's SHA-256> (and with each --tag).
Publishing again finds the AMI of that name and digest and uploads nothing (a completed
snapshot of the same file is reused under a new name); a name held by another image is an
error. --share-with lets an account launch the AMI (and create volumes from its snapshot);
--copy-to copies it into another region, tagged and shared the same way; both are applied
again to an AMI found, so a publish that failed part-way is finished by running it again.

A failure deletes what the run created (the snapshot, an AMI that did not become
available) or names what is left. Throttling, 5xx answers and broken connections are
retried. Credentials come from the AWS SDK's default chain (environment, shared config and
SSO profiles, web identity as in GitHub Actions OIDC, instance and container roles).
--endpoint-url sends EBS and EC2 calls to another URL (an emulator or a private endpoint);
AWS_ENDPOINT_URL_EBS and AWS_ENDPOINT_URL_EC2 set one service's. -o json prints
{"imageId","snapshotId","region","copies":{region: id},"reused"} for the next CI step.`,
		Example: `  kiln publish aws out/aws-worker.raw --region eu-west-1 --name kiln-aws-worker-$(date +%Y%m%d)
  kiln publish aws out/aws-worker.raw --region eu-west-1 --name kiln-worker-v1.2.0 \
      --tag team=platform --share-with 123456789012 --copy-to us-east-1 -o json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if format != "table" && format != "json" {
				return exitcode.Usagef("-o: unknown output format %q (want table or json)", format)
			}
			req, err := awsRequest(name, region, tags, shareWith, copyTo)
			if err != nil {
				return err
			}
			im, err := publish.Load(args[0])
			if err != nil {
				return err
			}
			if im.Format() != "raw" {
				return exitcode.Usagef("%s is a %s image: publish the .raw output of the bake", args[0], im.Format())
			}
			cfg, err := config.LoadDefaultConfig(cmd.Context(), config.WithRegion(region))
			if err != nil {
				return fmt.Errorf("publish aws: AWS configuration: %w", err)
			}
			a := publish.NewAWS(publish.AWSConfig{Config: cfg, Endpoint: endpoint})
			a.Log = slog.Default()
			a.Progress = newProgress(cmd.ErrOrStderr(), a.Log)
			res, err := a.Publish(cmd.Context(), im, req)
			if err != nil {
				return err
			}
			return printPublishAWS(cmd.OutOrStdout(), format, res)
		},
	}
	f := cmd.Flags()
	f.StringVar(&region, "region", "", "the region to publish in (required)")
	f.StringVar(&name, "name", "", "the AMI's name, in every region (required)")
	f.StringArrayVar(&tags, "tag", nil, "K=V: a tag on the snapshot and the AMIs (repeatable)")
	f.StringArrayVar(&shareWith, "share-with", nil, "an account id allowed to launch the AMI (repeatable)")
	f.StringArrayVar(&copyTo, "copy-to", nil, "a region to copy the AMI to (repeatable)")
	f.StringVarP(&format, "output", "o", "table", "output format: table or json")
	f.StringVar(&endpoint, "endpoint-url", "", "the URL of EBS and EC2 (an emulator or a private endpoint)")
	_ = cmd.MarkFlagRequired("region")
	_ = cmd.MarkFlagRequired("name")
	return cmd
}

// awsRequest makes the publish request of the flags, refusing bad ones as usage errors
// naming the flag.
func awsRequest(name, region string, tags, shareWith, copyTo []string) (publish.AWSRequest, error) {
	req := publish.AWSRequest{Name: name, Tags: map[string]string{}, ShareWith: shareWith, CopyTo: copyTo}
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
		var re *publish.RequestError
		if errors.As(err, &re) {
			return req, exitcode.Usagef("--%s %v", re.Field, re.Err)
		}
		return req, err
	}
	return req, nil
}

func printPublishAWS(w io.Writer, format string, res *publish.AWSResult) error {
	if format == "json" {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(res)
	}
	how := "registered"
	if res.Reused {
		how = "found (nothing uploaded)"
	}
	fmt.Fprintf(w, "%s\t%s\tsnapshot %s\t%s\n", res.Region, res.ImageID, res.SnapshotID, how)
	regions := make([]string, 0, len(res.Copies))
	for r := range res.Copies {
		regions = append(regions, r)
	}
	sort.Strings(regions)
	for _, r := range regions {
		fmt.Fprintf(w, "%s\t%s\tcopy\n", r, res.Copies[r])
	}
	if u := res.Upload; u != nil {
		fmt.Fprintf(w, "uploaded %d blocks (%d MiB) in %s, %.1f MiB/s; %d zero blocks skipped\n",
			u.Uploaded, u.Bytes>>20, u.Elapsed.Round(time.Second), u.MiBps(), u.Skipped)
	}
	return nil
}

// newProgress shows an upload's progress: one line rewritten on a terminal, otherwise a
// log line every 15 seconds and at the end.
func newProgress(w io.Writer, log *slog.Logger) func(publish.UploadProgress) {
	tty := isTerminal(w)
	var mu sync.Mutex
	var last time.Time
	return func(p publish.UploadProgress) {
		mu.Lock()
		defer mu.Unlock()
		done := p.Uploaded + p.Skipped
		if tty {
			fmt.Fprintf(w, "\rblocks %d/%d: %d put, %d zero skipped, %.1f MiB/s ", done, p.Blocks, p.Uploaded, p.Skipped, p.MiBps())
			if p.Done {
				fmt.Fprintln(w)
			}
			return
		}
		if p.Done || time.Since(last) >= 15*time.Second {
			last = time.Now()
			log.Info("publish aws: upload", "blocks", p.Blocks, "put", p.Uploaded, "skipped", p.Skipped, "MiB/s", fmt.Sprintf("%.1f", p.MiBps()), "done", p.Done)
		}
	}
}
