package source

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kilnproject/kiln/internal/cloudfake"
	"github.com/kilnproject/kiln/internal/testkit"
)

// The instance the metadata fakes describe.
const (
	testInstanceID = "i-0123456789abcdef0"
	testGCEID      = "4520031799277581759"
)

// newIMDS is the metadata service of an EC2 instance with IMDSv2 required and userData
// (nil for none).
func newIMDS(userData []byte) *cloudfake.IMDS {
	return &cloudfake.IMDS{InstanceID: testInstanceID, UserData: userData}
}

// newGCEMetadata is the metadata server of a GCE instance with attrs.
func newGCEMetadata(attrs map[string]string) *cloudfake.GCEMetadata {
	return &cloudfake.GCEMetadata{ID: testGCEID, Attributes: attrs}
}

// checkIMDSv2Only fails t unless the client asked f for a session token and sent nothing
// IMDS would refuse (a GET without the token, a token request without a TTL), nor, to a
// service without IMDSv2, any GET.
func checkIMDSv2Only(t *testing.T, f *cloudfake.IMDS) {
	t.Helper()
	if refused := f.Refused(); len(refused) != 0 {
		t.Errorf("metadata requests IMDS refuses: %q", refused)
	}
	calls := f.Calls()
	if !slices.Contains(calls, "PUT /latest/api/token") {
		t.Errorf("no token request: %q", calls)
	}
	if f.V1Only && slices.ContainsFunc(calls, func(c string) bool { return strings.HasPrefix(c, "GET ") }) {
		t.Errorf("IMDSv1 requests: %q", calls)
	}
}

// checkProbeFetch probes p and then fetches from it within fetchTimeout, and fails the
// test unless Probe answers wantProbe and Fetch returns wantData, or an error containing
// wantErr when that is set. It reports whether Fetch succeeded.
func checkProbeFetch(t *testing.T, p Provider, fetchTimeout time.Duration, wantProbe bool, wantData, wantErr string) bool {
	t.Helper()
	ctx := context.Background()
	if got := p.Probe(ctx); got != wantProbe {
		t.Fatalf("Probe = %v, want %v", got, wantProbe)
	}
	fctx, cancel := context.WithTimeout(ctx, fetchTimeout)
	defer cancel()
	data, err := p.Fetch(fctx)
	if wantErr != "" {
		if err == nil || !strings.Contains(err.Error(), wantErr) {
			t.Fatalf("Fetch = %q, %v; want error %q", data, err, wantErr)
		}
		return false
	}
	if err != nil || string(data) != wantData {
		t.Fatalf("Fetch = %q, %v; want %q", hex.EncodeToString(data), err, hex.EncodeToString([]byte(wantData)))
	}
	return true
}

func TestAWS(t *testing.T) {
	tests := []struct {
		name      string
		imds      *cloudfake.IMDS
		endpoint  string // overrides the fake
		wantProbe bool
		wantData  string
		wantErr   string
	}{
		{name: "user data", imds: newIMDS([]byte(ign)), wantProbe: true, wantData: ign},
		{name: "no user data falls through", imds: newIMDS(nil), wantProbe: true},
		{name: "user data error", imds: &cloudfake.IMDS{InstanceID: testInstanceID, Status: map[string]int{"/latest/user-data": http.StatusForbidden}},
			wantProbe: true, wantErr: "imds user-data"},
		{name: "IMDSv1-only service is not used", imds: &cloudfake.IMDS{InstanceID: testInstanceID, UserData: []byte(ign), V1Only: true},
			wantErr: "imds user-data"},
		{name: "no metadata service", endpoint: "http://" + testkit.ClosedAddr(t), wantErr: "imds user-data"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			endpoint := tc.endpoint
			if tc.imds != nil {
				srv := httptest.NewServer(tc.imds)
				defer srv.Close()
				endpoint = srv.URL
			}
			// Each probe here is answered, or refused, at once: however slow the machine, the
			// timeout must not decide it (TestProbeHungService covers the timeout).
			checkProbeFetch(t, &AWS{Endpoint: endpoint, ProbeTimeout: time.Minute}, 5*time.Second, tc.wantProbe, tc.wantData, tc.wantErr)
			if tc.imds != nil {
				checkIMDSv2Only(t, tc.imds)
			}
		})
	}
}

func TestGCE(t *testing.T) {
	gzipped := string(testkit.Gzip(t, []byte(ign)))
	tests := []struct {
		name      string
		handler   http.Handler
		host      string // overrides the server
		wantProbe bool
		wantData  string
		wantErr   string
	}{
		{name: "user data", handler: newGCEMetadata(map[string]string{"user-data": ign, "ssh-keys": "x"}), wantProbe: true, wantData: ign},
		{name: "binary user data kept", handler: newGCEMetadata(map[string]string{"user-data": gzipped}), wantProbe: true, wantData: gzipped},
		{name: "no user data falls through", handler: newGCEMetadata(map[string]string{"ssh-keys": "x"}), wantProbe: true},
		{name: "another cloud's metadata service", handler: newIMDS([]byte(ign)),
			wantErr: "not a Google metadata server"},
		{name: "no metadata service", host: testkit.ClosedAddr(t), wantErr: "connection refused"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			host := tc.host
			if tc.handler != nil {
				srv := httptest.NewServer(tc.handler)
				defer srv.Close()
				host = srv.Listener.Addr().String()
			}
			g := &GCE{Host: host, ProbeTimeout: time.Minute} // see TestAWS
			if !checkProbeFetch(t, g, 2*time.Second, tc.wantProbe, tc.wantData, tc.wantErr) {
				return
			}
			if f, ok := tc.handler.(*cloudfake.GCEMetadata); ok && len(f.Refused()) != 0 {
				t.Errorf("requests the metadata server refuses: %q", f.Refused())
			}
		})
	}
}

// TestProbeHungService: a metadata service that accepts connections and never answers
// makes Probe report false once ProbeTimeout has passed, instead of holding first boot.
func TestProbeHungService(t *testing.T) {
	hung := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done()
	}))
	defer hung.Close()
	for _, p := range []struct {
		name  string
		probe func(context.Context) bool
	}{
		{"aws", (&AWS{Endpoint: hung.URL, ProbeTimeout: 100 * time.Millisecond}).Probe},
		{"gce", (&GCE{Host: hung.Listener.Addr().String(), ProbeTimeout: 100 * time.Millisecond}).Probe},
	} {
		if p.probe(context.Background()) {
			t.Errorf("%s: Probe of a service that never answers = true", p.name)
		}
	}
}

// TestCloudSelect runs the aws and gce provider lists through Select, as first boot does,
// with base64-of-gzip user data.
func TestCloudSelect(t *testing.T) {
	encoded := []byte(base64.StdEncoding.EncodeToString(testkit.Gzip(t, []byte(ign))))
	imds := newIMDS(encoded)
	imdsSrv := httptest.NewServer(imds)
	defer imdsSrv.Close()
	gce := newGCEMetadata(map[string]string{"user-data": string(encoded)})
	gceSrv := httptest.NewServer(gce)
	defer gceSrv.Close()
	for _, p := range []Provider{
		&AWS{Endpoint: imdsSrv.URL},
		&GCE{Host: gceSrv.Listener.Addr().String()},
	} {
		t.Run(p.Name(), func(t *testing.T) {
			data, src, err := Select(context.Background(), []Provider{&CmdlineURL{Cmdline: "ro"}, p}, 5*time.Second)
			if err != nil || string(data) != ign || src != p.Name() {
				t.Errorf("Select = %q from %q, %v; want the decoded config from %s", data, src, err, p.Name())
			}
		})
	}
	checkIMDSv2Only(t, imds)
	if refused := gce.Refused(); len(refused) != 0 {
		t.Errorf("requests the metadata server refuses: %q", refused)
	}
}
