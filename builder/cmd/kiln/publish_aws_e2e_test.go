package main

import (
	"maps"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kilnproject/kiln/builder/publish/aws"
	"github.com/kilnproject/kiln/builder/publish/publishtest"
	"github.com/kilnproject/kiln/internal/exitcode"
)

// awsEnv starts the AWS fake and points the AWS SDK's default chain at it as a CI job would:
// credentials and the CA bundle from the environment, no shared config, no instance metadata.
// AWS_REGION names another region than the tests publish in, which --region overrides.
func awsEnv(t *testing.T) *publishtest.AWS {
	return awsEnvOf(t, publishtest.NewAWS(t))
}

// awsEnvOf points the AWS SDK's default chain at the fake f, as awsEnv.
func awsEnvOf(t *testing.T, f *publishtest.AWS) *publishtest.AWS {
	f.SetPending(0) // the CLI polls every 5s: complete at the first look
	dir := t.TempDir()
	for k, v := range map[string]string{
		"AWS_ACCESS_KEY_ID":           publishtest.AWSAccessKeyID,
		"AWS_SECRET_ACCESS_KEY":       publishtest.AWSSecretAccessKey,
		"AWS_SESSION_TOKEN":           "",
		"AWS_PROFILE":                 "",
		"AWS_REGION":                  "us-west-2",
		"AWS_CA_BUNDLE":               "",
		"AWS_CONFIG_FILE":             filepath.Join(dir, "config"),
		"AWS_SHARED_CREDENTIALS_FILE": filepath.Join(dir, "credentials"),
		"AWS_EC2_METADATA_DISABLED":   "true",
		"AWS_ENDPOINT_URL":            "",
		"AWS_ENDPOINT_URL_EBS":        "",
		"AWS_ENDPOINT_URL_EC2":        "",
		"AWS_ENDPOINT_URL_STS":        "",
	} {
		t.Setenv(k, v)
	}
	if strings.HasPrefix(f.URL(), "https:") {
		t.Setenv("AWS_CA_BUNDLE", f.CAFile(t))
	}
	return f
}

// awsRaw writes a 40 MiB raw disk with data in 3 of its 80 blocks, and its metadata.
func awsRaw(t *testing.T) (string, []byte) {
	content := randomAt(40<<20, 100<<10, 0, 7<<20, 40<<20-100<<10)
	path := rawDisk(t, t.TempDir(), "aws-worker", content)
	sidecar(t, path, "aws", "raw", 1<<30)
	return path, content
}

// kiln publish aws, given its endpoint by --endpoint-url or by the SDK's per-service
// variables, uploads the image into a snapshot equal to it, registers the AMI as EC2 needs
// it, copies it, and prints the ids the fake holds; run again, it prints the same ids,
// reused, and uploads nothing.
func TestPublishAWSCommand(t *testing.T) {
	for _, how := range []string{"--endpoint-url", "AWS_ENDPOINT_URL_EBS, _EC2 and _STS"} {
		t.Run(how, func(t *testing.T) {
			f := awsEnv(t)
			raw, content := awsRaw(t)
			args := []string{"publish", "aws", raw, "--region", "eu-west-1", "--name", "kiln-aws-worker",
				"--tag", "team=platform", "--share-with", "444455556666", "--copy-to", "us-east-1", "-o", "json"}
			if how == "--endpoint-url" {
				args = append(args, "--endpoint-url", f.URL())
			} else {
				for _, service := range []string{"EBS", "EC2", "STS"} {
					t.Setenv("AWS_ENDPOINT_URL_"+service, f.URL())
				}
			}
			var res aws.Result
			kilnJSON(t, &res, args...)
			if res.Reused || res.Region != "eu-west-1" || len(res.Copies) != 1 {
				t.Errorf("-o json: %+v, want a new image in eu-west-1 and one copy", res)
			}
			checkAMI(t, f, "eu-west-1", res.ImageID, res.SnapshotID, content)
			if c := f.Image("us-east-1", res.Copies["us-east-1"]); c == nil || c.Params.Get("SourceImageId") != res.ImageID {
				t.Errorf("copy %s in us-east-1: %+v", res.Copies["us-east-1"], c)
			}
			if s, i := f.Count("us-west-2"); s != 0 || i != 0 {
				t.Errorf("AWS_REGION's region has %d snapshots and %d images: --region was not used", s, i)
			}

			puts := f.Calls("PutSnapshotBlock")
			var again aws.Result
			kilnJSON(t, &again, args...)
			if !again.Reused || again.ImageID != res.ImageID || again.SnapshotID != res.SnapshotID || !maps.Equal(again.Copies, res.Copies) {
				t.Errorf("second publish printed %+v, want the ids of %+v, reused", again, res)
			}
			if res.Reason != "" || !strings.Contains(again.Reason, "AMI "+res.ImageID) {
				t.Errorf("-o json reason %q, then %q: want none, then why %s was reused", res.Reason, again.Reason, res.ImageID)
			}
			if n := f.Calls("PutSnapshotBlock"); n != puts || f.Calls("StartSnapshot") != 1 {
				t.Errorf("second publish: %d blocks put (%d before), %d snapshots started", n, puts, f.Calls("StartSnapshot"))
			}
		})
	}
}

// checkAMI checks the fake holds the AMI id of the snapshot snap in region, registered as
// kiln's images need, tagged and shared as asked, and the snapshot equal to content.
func checkAMI(t *testing.T, f *publishtest.AWS, region, id, snap string, content []byte) {
	t.Helper()
	img := f.Image(region, id)
	if img == nil {
		t.Fatalf("-o json printed image %s, which the fake does not hold in %s", id, region)
	}
	if err := f.SnapshotMatches(region, snap, content); err != nil {
		t.Error(err)
	}
	for k, want := range map[string]string{
		"Name": "kiln-aws-worker", "Architecture": "x86_64", "BootMode": "uefi", "EnaSupport": "true",
		"ImdsSupport": "v2.0", "RootDeviceName": "/dev/xvda", "BlockDeviceMapping.1.Ebs.SnapshotId": snap,
		"BlockDeviceMapping.1.Ebs.VolumeSize": "1", "BlockDeviceMapping.1.Ebs.VolumeType": "gp3",
	} {
		if got := img.Params.Get(k); got != want {
			t.Errorf("RegisterImage %s = %q, want %q", k, got, want)
		}
	}
	if img.Tags["team"] != "platform" || len(img.Tags[aws.DigestTag]) != 64 || strings.Join(img.LaunchPermission, ",") != "444455556666" {
		t.Errorf("AMI tags %v, launch permission %v", img.Tags, img.LaunchPermission)
	}
}

// A call AWS refuses fails the publish with exit 1, naming the call and the permission it
// needs, and leaves nothing behind; bad flags exit 2 before any call.
func TestPublishAWSCommandFails(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fault publishtest.Fault
		env   map[string]string
		flags []string
		code  int
		want  string
	}{
		{name: "StartSnapshot denied", code: exitcode.Failure,
			fault: publishtest.Fault{Op: "StartSnapshot", Times: -1, Status: 403, Code: "AccessDeniedException", Reason: "UNAUTHORIZED_ACCOUNT",
				Message: "User: arn:aws:iam::111122223333:user/ci is not authorized to perform: ebs:StartSnapshot"},
			want: "StartSnapshot in eu-west-1: access denied: the credentials need the IAM permission ebs:StartSnapshot"},
		{name: "RegisterImage denied", code: exitcode.Failure,
			fault: publishtest.Fault{Op: "RegisterImage", Times: -1, Status: 403, Code: "UnauthorizedOperation", Message: "You are not authorized to perform this operation."},
			want:  "the credentials need the IAM permission ec2:RegisterImage"},
		{name: "credentials refused", env: map[string]string{"AWS_SECRET_ACCESS_KEY": "not-the-secret"}, code: exitcode.Failure,
			want: "GetCallerIdentity in eu-west-1: the credentials were refused (InvalidClientTokenId"},
		{name: "bad tag", flags: []string{"--tag", "kiln:sha256=x"}, code: exitcode.BadUsage, want: "--tag kiln:sha256 is kiln's own tag"},
		{name: "bad region", flags: []string{"--region", "EU-WEST-1"}, code: exitcode.BadUsage, want: `--region "EU-WEST-1": not a region name`},
		{name: "bad account", flags: []string{"--share-with", "ci"}, code: exitcode.BadUsage, want: `--share-with "ci"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := awsEnv(t)
			if tc.fault.Op != "" {
				f.Inject(tc.fault)
			}
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			raw, _ := awsRaw(t)
			args := append([]string{"publish", "aws", raw, "--region", "eu-west-1", "--name", "kiln-aws-worker", "--endpoint-url", f.URL()}, tc.flags...)
			out, errs, code := runCLI(t, args...)
			if code != tc.code || !strings.Contains(errs, tc.want) || out != "" {
				t.Errorf("kiln %s: exit %d, stdout %q, stderr %s; want exit %d naming %q", strings.Join(args, " "), code, out, errs, tc.code, tc.want)
			}
			if s, i := f.Count("eu-west-1"); s != 0 || i != 0 {
				t.Errorf("%d snapshots and %d images left", s, i)
			}
			if tc.code == exitcode.BadUsage && f.Calls("DescribeImages")+f.Calls("StartSnapshot") != 0 {
				t.Errorf("a bad command line called AWS")
			}
		})
	}
}

// An http:// endpoint sends nothing unless --insecure-http is given: given by --endpoint-url
// it is a usage error; given by the SDK's variables, every call is refused before it is
// signed. With --insecure-http the publish goes through.
func TestPublishAWSCommandPlainHTTP(t *testing.T) {
	for _, tc := range []struct {
		name     string
		flag     bool // the endpoint given by --endpoint-url, not the environment
		insecure bool
		code     int
		want     string
	}{
		{name: "--endpoint-url", flag: true, code: exitcode.BadUsage, want: "credentials would go in clear text; use https, or --insecure-http"},
		{name: "AWS_ENDPOINT_URL_*", code: exitcode.Failure, want: "refusing to send AWS credentials to http://"},
		{name: "--endpoint-url --insecure-http", flag: true, insecure: true},
		{name: "AWS_ENDPOINT_URL_* --insecure-http", insecure: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := awsEnvOf(t, publishtest.NewPlainAWS(t))
			raw, content := awsRaw(t)
			args := []string{"publish", "aws", raw, "--region", "eu-west-1", "--name", "kiln-aws-worker", "-o", "json"}
			if tc.flag {
				args = append(args, "--endpoint-url", f.URL())
			} else {
				for _, service := range []string{"EBS", "EC2", "STS"} {
					t.Setenv("AWS_ENDPOINT_URL_"+service, f.URL())
				}
			}
			if tc.insecure {
				args = append(args, "--insecure-http")
				var res aws.Result
				kilnJSON(t, &res, args...)
				if err := f.SnapshotMatches("eu-west-1", res.SnapshotID, content); err != nil {
					t.Error(err)
				}
				return
			}
			out, errs, code := runCLI(t, args...)
			if code != tc.code || out != "" || !strings.Contains(errs, tc.want) {
				t.Errorf("kiln %s: exit %d, stdout %q, stderr %s; want exit %d with %q", strings.Join(args, " "), code, out, errs, tc.code, tc.want)
			}
			if n := f.AllCalls(); n != 0 {
				t.Errorf("%d calls reached the plain-http endpoint", n)
			}
		})
	}
}
