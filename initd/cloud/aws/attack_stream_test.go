package aws

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kilnproject/kiln/initd/config"
	"github.com/kilnproject/kiln/initd/source"
	"github.com/kilnproject/kiln/internal/cloudfake"
	"github.com/kilnproject/kiln/internal/testkit"
)

// The attack: a metadata service that answers far more than source.MaxConfigSize. The
// IMDS source, and the IMDS clients first boot uses for its other lookups, stop at the
// cap.

// hostileAnswer is how much a hostile server offers: eight times the cap.
const hostileAnswer = 8 * source.MaxConfigSize

// TestAttackEndlessAnswer: an IMDS that answers far more than source.MaxConfigSize, as
// user data or as the session token, makes the source fail, naming the source and the
// cap, after reading no more than the cap: the client stops taking bytes and the heap
// does not grow with the answer.
func TestAttackEndlessAnswer(t *testing.T) {
	tests := []struct {
		name    string
		handler *hostileIMDS
		// direct: call Fetch rather than Select (a token that never ends makes Probe
		// say no, so Select would just skip the source).
		direct  bool
		wantErr []string
	}{
		{
			name:    "aws user data",
			handler: &hostileIMDS{Streamer: testkit.Streamer{Total: hostileAnswer}, IMDS: cloudfake.IMDS{InstanceID: testInstanceID}},
			wantErr: []string{"config source aws-imds", "imds user-data", "64 MiB cap"},
		},
		{
			name:    "aws session token",
			handler: &hostileIMDS{Streamer: testkit.Streamer{Total: hostileAnswer}, IMDS: cloudfake.IMDS{InstanceID: testInstanceID}, streamToken: true},
			direct:  true,
			wantErr: []string{"imds user-data", "64 MiB cap"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(tc.handler)
			defer srv.Close()
			p := &IMDS{Endpoint: srv.URL, ProbeTimeout: time.Minute}

			before := testkit.HeapAllocated()
			var err error
			if tc.direct {
				_, err = p.Fetch(context.Background())
			} else {
				_, _, err = source.Select(context.Background(), []source.Provider{p}, 5*time.Minute)
			}
			grown := testkit.HeapAllocated() - before

			if err == nil {
				t.Fatal("a never-ending answer was accepted")
			}
			for _, want := range tc.wantErr {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not contain %q", err, want)
				}
			}
			tc.handler.CheckStopped(t, grown, source.MaxConfigSize)
		})
	}
}

// hostileIMDS is an IMDSv2 service whose user data, or whose session token, never ends.
type hostileIMDS struct {
	testkit.Streamer
	cloudfake.IMDS
	streamToken bool
}

func (h *hostileIMDS) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case h.streamToken && r.Method == http.MethodPut:
		w.Header().Set("X-aws-ec2-metadata-token-ttl-seconds", r.Header.Get("X-aws-ec2-metadata-token-ttl-seconds"))
		h.Stream(w)
	case !h.streamToken && r.Method == http.MethodGet && r.URL.Path == "/latest/user-data":
		h.Stream(w)
	default:
		h.IMDS.ServeHTTP(w, r)
	}
}

// TestAttackEndlessLookup: the IMDS clients that first boot uses for its other lookups
// (the etcd volume's instance id and zone, the region and credentials of the node's
// AWS calls) stop at the cap too.
func TestAttackEndlessLookup(t *testing.T) {
	tests := []struct {
		name   string
		lookup func(ctx context.Context, srv *httptest.Server) error
	}{
		{name: "imds instance-id", lookup: func(ctx context.Context, srv *httptest.Server) error {
			_, err := newIMDSClient(srv.URL, nil).metadata(ctx, "instance-id")
			return err
		}},
		{name: "imds identity", lookup: func(ctx context.Context, srv *httptest.Server) error {
			_, err := readInstance(ctx, srv.URL)
			return err
		}},
		{name: "imds region from node.yaml's aws.endpoints.imds", lookup: func(ctx context.Context, srv *httptest.Server) error {
			// The environment does not name the node's IMDS: the endpoint given is asked.
			t.Setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", "http://127.0.0.1:1")
			n := &config.Node{}
			n.AWS.Endpoints.IMDS = srv.URL
			_, err := newAPISession(ctx, n)
			return err
		}},
		{name: "imds region for the node's Route 53 calls", lookup: func(ctx context.Context, srv *httptest.Server) error {
			n := &config.Node{DNS: config.DNS{Provider: config.DNSRoute53}}
			n.AWS.Endpoints.IMDS = srv.URL
			_, err := (Cloud{}).DNS(ctx, n)
			return err
		}},
		{name: "imds instance-role credentials for the node's AWS calls", lookup: func(ctx context.Context, srv *httptest.Server) error {
			_, err := (&roleCredentials{imds: newIMDSClient(srv.URL, nil)}).retrieve(ctx)
			return err
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := &hostileLookup{Streamer: testkit.Streamer{Total: hostileAnswer}}
			srv := httptest.NewServer(h)
			defer srv.Close()
			before := testkit.HeapAllocated()
			err := tc.lookup(context.Background(), srv)
			grown := testkit.HeapAllocated() - before
			if err == nil || !strings.Contains(err.Error(), "64 MiB cap") {
				t.Fatalf("lookup error = %v; want the 64 MiB cap", err)
			}
			h.CheckStopped(t, grown, source.MaxConfigSize)
		})
	}
}

// hostileLookup is a metadata server (IMDSv2 or Google) whose every metadata answer
// never ends.
type hostileLookup struct {
	testkit.Streamer
	cloudfake.IMDS
}

func (h *hostileLookup) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.Method == http.MethodPut:
		h.IMDS.ServeHTTP(w, r) // the session token
	default:
		w.Header().Set("Metadata-Flavor", "Google")
		h.Stream(w)
	}
}
