package aws

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

	"github.com/kilnproject/kiln/initd/source"
	"github.com/kilnproject/kiln/internal/cloudfake"
	"github.com/kilnproject/kiln/internal/testkit"
)

// The instance the metadata fake describes.
const testInstanceID = "i-0123456789abcdef0"

// ign is a config the sources fetch.
const ign = `{"ignition":{"version":"3.4.0"}}`

// newIMDS is the metadata service of an EC2 instance with IMDSv2 required and userData
// (nil for none).
func newIMDS(userData []byte) *cloudfake.IMDS {
	return &cloudfake.IMDS{InstanceID: testInstanceID, UserData: userData}
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
func checkProbeFetch(t *testing.T, p source.Provider, fetchTimeout time.Duration, wantProbe bool, wantData, wantErr string) bool {
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

func TestIMDS(t *testing.T) {
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
			checkProbeFetch(t, &IMDS{Endpoint: endpoint, ProbeTimeout: time.Minute}, 5*time.Second, tc.wantProbe, tc.wantData, tc.wantErr)
			if tc.imds != nil {
				checkIMDSv2Only(t, tc.imds)
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
	if (&IMDS{Endpoint: hung.URL, ProbeTimeout: 100 * time.Millisecond}).Probe(context.Background()) {
		t.Errorf("Probe of a service that never answers = true")
	}
}

// TestCloudSelect runs the aws provider list through source.Select, as first boot does,
// with base64-of-gzip user data.
func TestCloudSelect(t *testing.T) {
	encoded := []byte(base64.StdEncoding.EncodeToString(testkit.Gzip(t, []byte(ign))))
	imds := newIMDS(encoded)
	imdsSrv := httptest.NewServer(imds)
	defer imdsSrv.Close()
	p := &IMDS{Endpoint: imdsSrv.URL}
	data, src, err := source.Select(context.Background(), []source.Provider{&source.CmdlineURL{Cmdline: "ro"}, p}, 5*time.Second)
	if err != nil || string(data) != ign || src != p.Name() {
		t.Errorf("Select = %q from %q, %v; want the decoded config from %s", data, src, err, p.Name())
	}
	checkIMDSv2Only(t, imds)
}
