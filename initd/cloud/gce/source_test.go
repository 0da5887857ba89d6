package gce

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kilnproject/kiln/initd/source"
	"github.com/kilnproject/kiln/internal/cloudfake"
	"github.com/kilnproject/kiln/internal/testkit"
)

// The instance the metadata fake describes.
const testGCEID = "4520031799277581759"

// ign is a config the sources fetch.
const ign = `{"ignition":{"version":"3.4.0"}}`

// newGCEMetadata is the metadata server of a GCE instance with attrs.
func newGCEMetadata(attrs map[string]string) *cloudfake.GCEMetadata {
	return &cloudfake.GCEMetadata{ID: testGCEID, Attributes: attrs}
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

func TestMetadata(t *testing.T) {
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
		{name: "another cloud's metadata service", handler: &cloudfake.IMDS{InstanceID: "i-0123456789abcdef0", UserData: []byte(ign)},
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
			g := &Metadata{Host: host, ProbeTimeout: time.Minute} // answered at once: the timeout must not decide it
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
	if (&Metadata{Host: hung.Listener.Addr().String(), ProbeTimeout: 100 * time.Millisecond}).Probe(context.Background()) {
		t.Errorf("Probe of a service that never answers = true")
	}
}

// TestCloudSelect runs the gce provider list through source.Select, as first boot does,
// with base64-of-gzip user data.
func TestCloudSelect(t *testing.T) {
	encoded := []byte(base64.StdEncoding.EncodeToString(testkit.Gzip(t, []byte(ign))))
	gce := newGCEMetadata(map[string]string{"user-data": string(encoded)})
	gceSrv := httptest.NewServer(gce)
	defer gceSrv.Close()
	p := &Metadata{Host: gceSrv.Listener.Addr().String()}
	data, src, err := source.Select(context.Background(), []source.Provider{&source.CmdlineURL{Cmdline: "ro"}, p}, 5*time.Second)
	if err != nil || string(data) != ign || src != p.Name() {
		t.Errorf("Select = %q from %q, %v; want the decoded config from %s", data, src, err, p.Name())
	}
	if refused := gce.Refused(); len(refused) != 0 {
		t.Errorf("requests the metadata server refuses: %q", refused)
	}
}
