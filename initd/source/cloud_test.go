package source

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kilnproject/kiln/internal/testkit"
)

// fakeIMDS speaks the EC2 instance metadata protocol as EC2 does with IMDSv2 required
// (HttpTokens=required): PUT /latest/api/token with a TTL header of 1..21600 seconds
// yields a token; every GET must carry it, else 401.
type fakeIMDS struct {
	userData  []byte // nil: the instance has no user data (404)
	failUser  int    // status to answer user-data with, when not 0
	tokenPath string // "" means /latest/api/token; another path makes the token request 404

	mu        sync.Mutex
	tokens    map[string]time.Time
	ttls      []string
	tokenless int // GETs without a valid token: IMDSv1 attempts
}

func (f *fakeIMDS) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	tokenPath := f.tokenPath
	if tokenPath == "" {
		tokenPath = "/latest/api/token"
	}
	if r.Method == http.MethodPut {
		f.ttls = append(f.ttls, r.Header.Get("X-aws-ec2-metadata-token-ttl-seconds"))
	}
	switch {
	case r.Method == http.MethodPut && r.URL.Path == tokenPath:
		if r.Header.Get("X-Forwarded-For") != "" {
			http.Error(w, "Forbidden", http.StatusForbidden)
			return
		}
		ttl := r.Header.Get("X-aws-ec2-metadata-token-ttl-seconds")
		n, err := strconv.Atoi(ttl)
		if err != nil || n < 1 || n > 21600 {
			http.Error(w, "Bad Request", http.StatusBadRequest)
			return
		}
		b := make([]byte, 16)
		rand.Read(b)
		tok := base64.StdEncoding.EncodeToString(b)
		if f.tokens == nil {
			f.tokens = map[string]time.Time{}
		}
		f.tokens[tok] = time.Now().Add(time.Duration(n) * time.Second)
		w.Header().Set("X-aws-ec2-metadata-token-ttl-seconds", ttl)
		w.Write([]byte(tok))
	case r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/latest/"):
		exp, ok := f.tokens[r.Header.Get("X-aws-ec2-metadata-token")]
		if !ok || time.Now().After(exp) {
			f.tokenless++
			http.Error(w, "Unauthorized", http.StatusUnauthorized)
			return
		}
		switch r.URL.Path {
		case "/latest/meta-data/instance-id":
			w.Write([]byte("i-0123456789abcdef0"))
		case "/latest/user-data":
			if f.failUser != 0 {
				http.Error(w, http.StatusText(f.failUser), f.failUser)
				return
			}
			if f.userData == nil {
				http.NotFound(w, r)
				return
			}
			w.Write(f.userData)
		default:
			http.NotFound(w, r)
		}
	case r.Method != http.MethodGet && r.Method != http.MethodPut:
		http.Error(w, "Method Not Allowed", http.StatusMethodNotAllowed)
	default:
		http.NotFound(w, r)
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
		imds      *fakeIMDS
		endpoint  string // overrides the fake
		wantProbe bool
		wantData  string
		wantErr   string
	}{
		{name: "user data", imds: &fakeIMDS{userData: []byte(ign)}, wantProbe: true, wantData: ign},
		{name: "no user data falls through", imds: &fakeIMDS{}, wantProbe: true},
		{name: "user data error", imds: &fakeIMDS{failUser: http.StatusForbidden}, wantProbe: true, wantErr: "imds user-data"},
		{name: "IMDSv1-only service is not used", imds: &fakeIMDS{tokenPath: "/nowhere", userData: []byte(ign)}, wantErr: "imds user-data"},
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
			if tc.imds == nil {
				return
			}
			tc.imds.mu.Lock()
			defer tc.imds.mu.Unlock()
			if tc.imds.tokenless != 0 {
				t.Errorf("%d metadata requests without a token (IMDSv1)", tc.imds.tokenless)
			}
			if len(tc.imds.ttls) == 0 {
				t.Error("no token request")
			}
			for _, ttl := range tc.imds.ttls {
				if ttl == "" {
					t.Error("token request without a TTL")
				}
			}
		})
	}
}

// fakeGCE answers like the GCE metadata server: 403 without Metadata-Flavor: Google,
// and Metadata-Flavor: Google on every answer.
type fakeGCE struct {
	attrs map[string]string

	mu         sync.Mutex
	noFlavored int
}

func (f *fakeGCE) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Metadata-Flavor", "Google")
	if r.Header.Get("Metadata-Flavor") != "Google" {
		f.mu.Lock()
		f.noFlavored++
		f.mu.Unlock()
		http.Error(w, "Missing Metadata-Flavor:Google header.", http.StatusForbidden)
		return
	}
	p, ok := strings.CutPrefix(r.URL.Path, "/computeMetadata/v1/")
	if !ok {
		http.NotFound(w, r)
		return
	}
	if p == "instance/id" {
		w.Write([]byte("4520031799277581759"))
		return
	}
	if name, ok := strings.CutPrefix(p, "instance/attributes/"); ok {
		if v, ok := f.attrs[name]; ok {
			w.Write([]byte(v))
			return
		}
	}
	http.NotFound(w, r)
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
		{name: "user data", handler: &fakeGCE{attrs: map[string]string{"user-data": ign, "ssh-keys": "x"}}, wantProbe: true, wantData: ign},
		{name: "binary user data kept", handler: &fakeGCE{attrs: map[string]string{"user-data": gzipped}}, wantProbe: true, wantData: gzipped},
		{name: "no user data falls through", handler: &fakeGCE{attrs: map[string]string{"ssh-keys": "x"}}, wantProbe: true},
		{name: "another cloud's metadata service", handler: &fakeIMDS{userData: []byte(ign)},
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
			if f, ok := tc.handler.(*fakeGCE); ok && f.noFlavored != 0 {
				t.Errorf("%d requests without Metadata-Flavor: Google", f.noFlavored)
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
	imdsSrv := httptest.NewServer(&fakeIMDS{userData: encoded})
	defer imdsSrv.Close()
	gceSrv := httptest.NewServer(&fakeGCE{attrs: map[string]string{"user-data": string(encoded)}})
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
}
