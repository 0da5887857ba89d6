package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
)

// A controller that writes the object between apply's read and its apply (a Deployment's
// status, say) is not taken for a change of apply's own: the apply carries the version it
// read, the server refuses it, and apply reads and applies again.
func TestApplyNotFooledByAnotherWriter(t *testing.T) {
	var (
		mu      sync.Mutex
		rv      = 1
		patches []string // the resourceVersion each apply carried
		raced   bool
	)
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		switch r.Method {
		case http.MethodGet:
			fmt.Fprintf(w, `{"metadata":{"name":"coredns","resourceVersion":"%d"}}`, rv)
			if !raced { // another writer, right after this read
				raced = true
				rv++
			}
		case http.MethodPatch:
			var obj struct {
				Metadata struct{ ResourceVersion string } `json:"metadata"`
			}
			body, _ := io.ReadAll(r.Body)
			json.Unmarshal(body, &obj)
			patches = append(patches, obj.Metadata.ResourceVersion)
			if obj.Metadata.ResourceVersion != "" && obj.Metadata.ResourceVersion != fmt.Sprint(rv) {
				w.WriteHeader(http.StatusConflict)
				fmt.Fprint(w, `{"kind":"Status","code":409,"reason":"Conflict","message":"the object has been modified"}`)
				return
			}
			// The applied fields are already there: the server writes nothing.
			fmt.Fprintf(w, `{"metadata":{"name":"coredns","resourceVersion":"%d"}}`, rv)
		}
	}))
	defer srv.Close()
	c := &Client{server: srv.URL, httpClient: srv.Client()}
	obj := object{"apiVersion": "v1", "kind": "ConfigMap", "metadata": map[string]any{"name": "coredns", "namespace": "kube-system"},
		"data": map[string]any{"Corefile": "."}}
	changed, err := c.apply(context.Background(), obj)
	if err != nil {
		t.Fatal(err)
	}
	if changed {
		t.Errorf("Apply reported a change: another writer's version taken for its own (applies carried %q)", patches)
	}
	if want := []string{"1", "2"}; fmt.Sprint(patches) != fmt.Sprint(want) {
		t.Errorf("applies carried resourceVersions %q, want %q", patches, want)
	}
	if _, ok := obj["metadata"].(map[string]any)["resourceVersion"]; ok {
		t.Errorf("Apply changed the caller's object")
	}
}
