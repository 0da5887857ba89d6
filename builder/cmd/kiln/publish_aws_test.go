package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kilnproject/kiln/builder/publish/aws"
	"github.com/kilnproject/kiln/internal/exitcode"
)

// Bad flags of kiln publish aws are usage errors naming the flag, found before any AWS
// call; an image that is not raw is refused with the file to publish instead.
func TestPublishAWSFlags(t *testing.T) {
	dir := t.TempDir()
	vmdk := filepath.Join(dir, "aws-worker.vmdk")
	os.WriteFile(vmdk, []byte("vmdk"), 0o644)
	os.WriteFile(filepath.Join(dir, "aws-worker.json"), []byte(`{"outputs":[{"format":"vmdk","file":"aws-worker.vmdk","size":4,"sha256":"`+strings.Repeat("0", 64)+`"}]}`), 0o644)
	base := []string{"publish", "aws", vmdk, "--region", "eu-west-1"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"publish", "aws", vmdk, "--name", "kiln-a"}, `"region" not set`},
		{append(base, "--name", "ab"), `--name "ab"`},
		{append(base, "--name", "kiln-a", "--tag", "team"), `--tag "team": want KEY=VALUE`},
		{append(base, "--name", "kiln-a", "--tag", "=x"), `--tag "=x"`},
		{append(base, "--name", "kiln-a", "--tag", "a=1", "--tag", "a=2"), "the key a is given twice"},
		{append(base, "--name", "kiln-a", "--tag", "kiln:sha256=x"), "--tag kiln:sha256 is kiln's own tag"},
		{append(base, "--name", "kiln-a", "--share-with", "1234"), `--share-with "1234"`},
		{append(base, "--name", "kiln-a", "--copy-to", "eu-west-1"), "--copy-to eu-west-1: that is the region"},
		{append(base, "--name", "kiln-a", "--copy-to", "mars"), `--copy-to "mars"`},
		{append(base, "--name", "kiln-a", "-o", "yaml"), `-o: unknown output format "yaml"`},
		{append(base, "--name", "kiln-a"), "is a vmdk image: publish the .raw output of the bake"},
	} {
		out, code := runKiln(t, tc.args...)
		if code != exitcode.BadUsage || !strings.Contains(out, tc.want) {
			t.Errorf("kiln %s: exit %d, %q; want exit %d with %q", strings.Join(tc.args, " "), code, out, exitcode.BadUsage, tc.want)
		}
	}
}

// -o json prints the ids under the names a CI step reads.
func TestPublishAWSJSON(t *testing.T) {
	var b bytes.Buffer
	res := &aws.Result{ImageID: "ami-1", SnapshotID: "snap-1", Region: "eu-west-1", Copies: map[string]string{"us-east-1": "ami-2"}, Reused: true}
	if err := printResult(&b, "json", res); err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(b.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"imageId": "ami-1", "snapshotId": "snap-1", "region": "eu-west-1", "copies": map[string]any{"us-east-1": "ami-2"}, "reused": true}
	if g, w := mustJSON(got), mustJSON(want); g != w {
		t.Errorf("-o json = %s, want %s", g, w)
	}
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
