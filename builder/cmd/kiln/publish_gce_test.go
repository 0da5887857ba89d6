package main

import (
	"bytes"
	"context"
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/kilnproject/kiln/builder/publish/gce"
	"github.com/kilnproject/kiln/internal/exitcode"
)

// A wrong command line of publish gce is a usage error naming the flag, found before any file
// is read or any API called.
func TestPublishGCEUsage(t *testing.T) {
	base := []string{"publish", "gce", "out/gce-worker.tar.gz", "--project", "p", "--bucket", "b"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--label", "role=worker"}, `required flag(s) "name" not set`},
		{[]string{"--name", "Kiln_Worker"}, "--name:"},
		{[]string{"--name", "n", "--family", "-x"}, "--family:"},
		{[]string{"--name", "n", "--label", "role"}, `--label "role": want KEY=VALUE`},
		{[]string{"--name", "n", "--label", "Role=w"}, "key must start with a lowercase letter"},
		{[]string{"--name", "n", "--label", "role=Worker"}, `value has 'W'`},
		{[]string{"--name", "n", "--label", "k=" + strings.Repeat("a", 64)}, "has 64 characters, at most 63"},
		{[]string{"--name", "n", "--label", "kiln-sha256=x"}, "set by kiln"},
		{[]string{"--name", "n", "--label", "a=1", "--label", "a=2"}, "given twice"},
		{[]string{"--name", "n", "-o", "yaml"}, "-o: unknown output format"},
		{[]string{"--name", "n", "--chunk-size", "0"}, "--chunk-size"},
		{[]string{"--name", "n", "--storage-endpoint", "http://127.0.0.1:4443"}, "--storage-endpoint: \"http://127.0.0.1:4443\": credentials would go in clear text"},
		{[]string{"--name", "n", "--compute-endpoint", "localhost:8080"}, "--compute-endpoint: \"localhost:8080\": want an http(s) URL"},
	} {
		var stderr bytes.Buffer
		root := newRoot()
		root.SetOut(&bytes.Buffer{})
		args := append(append([]string{}, base...), tc.args...)
		if got := execute(context.Background(), root, args, &stderr); got != exitcode.BadUsage || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("kiln %s: exit %d, stderr %q; want %d and %q", strings.Join(args, " "), got, stderr.String(), exitcode.BadUsage, tc.want)
		}
	}
}

// -o json prints the fields a CI step reads, under the names the README gives.
func TestPrintGCEResultJSON(t *testing.T) {
	var out bytes.Buffer
	res := &gce.Result{Image: "kiln-worker-7", SelfLink: "https://www.googleapis.com/compute/v1/projects/p/global/images/kiln-worker-7", Object: "gs://b/kiln-worker-7.tar.gz"}
	if err := printResult(&out, "json", res); err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"image": res.Image, "selfLink": res.SelfLink, "object": res.Object, "reused": false}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("-o json printed %v, want %v", got, want)
	}
}
