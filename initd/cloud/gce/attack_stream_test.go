package gce

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kilnproject/kiln/initd/source"
	"github.com/kilnproject/kiln/internal/cloudfake"
	"github.com/kilnproject/kiln/internal/testkit"
)

// The attack: a metadata server that answers far more than source.MaxConfigSize. The
// metadata source, and the metadata client first boot uses for its other lookups, stop
// at the cap.

// hostileAnswer is how much a hostile server offers: eight times the cap.
const hostileAnswer = 8 * source.MaxConfigSize

// hostileGCE is a Google metadata server whose user-data attribute never ends.
type hostileGCE struct {
	testkit.Streamer
	cloudfake.GCEMetadata
}

func (h *hostileGCE) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/computeMetadata/v1/instance/attributes/"+UserDataAttribute {
		w.Header().Set("Metadata-Flavor", "Google")
		h.Stream(w)
		return
	}
	h.GCEMetadata.ServeHTTP(w, r)
}

// TestAttackEndlessAnswer: a metadata server whose user-data attribute is far more than
// source.MaxConfigSize makes the source fail, naming the source and the cap, after
// reading no more than the cap.
func TestAttackEndlessAnswer(t *testing.T) {
	h := &hostileGCE{Streamer: testkit.Streamer{Total: hostileAnswer}, GCEMetadata: cloudfake.GCEMetadata{ID: testGCEID}}
	srv := httptest.NewServer(h)
	defer srv.Close()
	p := &Metadata{Host: srv.Listener.Addr().String(), ProbeTimeout: time.Minute}
	before := testkit.HeapAllocated()
	_, _, err := source.Select(context.Background(), []source.Provider{p}, 5*time.Minute)
	grown := testkit.HeapAllocated() - before
	if err == nil {
		t.Fatal("a never-ending answer was accepted")
	}
	for _, want := range []string{"config source gce-metadata", "instance/attributes/user-data", "64 MiB cap"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not contain %q", err, want)
		}
	}
	h.CheckStopped(t, grown, source.MaxConfigSize)
}

// hostileLookup is a Google metadata server whose every answer never ends.
type hostileLookup struct{ testkit.Streamer }

func (h *hostileLookup) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Metadata-Flavor", "Google")
	h.Stream(w)
}

// TestAttackEndlessLookup: the metadata client that first boot uses for its other
// lookups (the etcd volume's instance, the DNS provider's project) stops at the cap too.
func TestAttackEndlessLookup(t *testing.T) {
	h := &hostileLookup{Streamer: testkit.Streamer{Total: hostileAnswer}}
	srv := httptest.NewServer(h)
	defer srv.Close()
	t.Setenv("GCE_METADATA_HOST", srv.Listener.Addr().String())
	before := testkit.HeapAllocated()
	_, err := newMetadataClient("", nil).getTrimmed(context.Background(), "instance/name")
	grown := testkit.HeapAllocated() - before
	if err == nil || !strings.Contains(err.Error(), "64 MiB cap") {
		t.Fatalf("lookup error = %v; want the 64 MiB cap", err)
	}
	h.CheckStopped(t, grown, source.MaxConfigSize)
}
