package gce

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kilnproject/kiln/internal/poll"
	"github.com/kilnproject/kiln/internal/testkit"
)

// staticToken is a tokenSource that gives one token.
type staticToken string

func (s staticToken) token(context.Context) (string, error) { return string(s), nil }

// failingToken is a tokenSource that has no token.
type failingToken struct{}

func (failingToken) token(context.Context) (string, error) {
	return "", errors.New("GCE metadata instance/service-accounts/default/token: not defined")
}

// fastRetry makes c pause a millisecond between attempts.
func fastRetry(c *apiClient) *apiClient {
	c.retry.Backoff = poll.Backoff{Initial: time.Millisecond}
	return c
}

// TestAPIURL: the URL of each method is the one the generated clients build, with node.yaml's
// endpoint as the base URL as option.WithEndpoint took it.
func TestAPIURL(t *testing.T) {
	tests := []struct {
		endpoint string
		path     []string
		query    map[string]string
		want     string
	}{
		{defaultComputeEndpoint, zonePath("kiln-prod", "europe-west4-a", "disks", "prod-etcd-b"), nil,
			"https://compute.googleapis.com/compute/v1/projects/kiln-prod/zones/europe-west4-a/disks/prod-etcd-b?alt=json&prettyPrint=false"},
		{defaultComputeEndpoint, zonePath("p", "z", "disks"), map[string]string{"filter": `(labels.a = "b") (labels.c:*)`, "pageToken": "t1"},
			"https://compute.googleapis.com/compute/v1/projects/p/zones/z/disks?alt=json&filter=%28labels.a+%3D+%22b%22%29+%28labels.c%3A%2A%29&pageToken=t1&prettyPrint=false"},
		{defaultDNSEndpoint, []string{"dns", "v1", "projects", "p", "managedZones"}, map[string]string{"dnsName": "example.test."},
			"https://dns.googleapis.com/dns/v1/projects/p/managedZones?alt=json&dnsName=example.test.&prettyPrint=false"},
		// Private Service Connect: another host, the same path.
		{"https://compute-kiln.p.googleapis.com/compute/v1/", zonePath("p", "z", "operations", "operation-1", "wait"), nil,
			"https://compute-kiln.p.googleapis.com/compute/v1/projects/p/zones/z/operations/operation-1/wait?alt=json&prettyPrint=false"},
		{"http://127.0.0.1:8080", []string{"dns", "v1", "projects", "p", "managedZones"}, nil,
			"http://127.0.0.1:8080/dns/v1/projects/p/managedZones?alt=json&prettyPrint=false"},
		// A base without its final slash loses its last segment, as a relative reference
		// resolves (and as the generated clients resolved it).
		{"https://compute.example.test/compute/v1", zonePath("p", "z", "disks", "d"), nil,
			"https://compute.example.test/compute/projects/p/zones/z/disks/d?alt=json&prettyPrint=false"},
		// Segments are escaped as the generated clients expand path templates.
		{defaultComputeEndpoint, zonePath("example.com:kiln", "z", "disks", "a b/c~é"), nil,
			"https://compute.googleapis.com/compute/v1/projects/example.com%3Akiln/zones/z/disks/a%20b%2Fc~%C3%A9?alt=json&prettyPrint=false"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			c, err := newAPIClient(tt.endpoint, nil)
			if err != nil {
				t.Fatal(err)
			}
			q := map[string][]string{}
			for k, v := range tt.query {
				q[k] = []string{v}
			}
			if got := c.url(tt.path, q).String(); got != tt.want {
				t.Errorf("url = %s\n      want %s", got, tt.want)
			}
		})
	}
	for _, bad := range []string{"", "compute.googleapis.com", "ftp://h/", "https:///x"} {
		if _, err := newAPIClient(bad, nil); err == nil {
			t.Errorf("newAPIClient(%q) took it", bad)
		}
	}
}

// TestDecodeAPIError: Google's JSON error answers, and answers that are not.
func TestDecodeAPIError(t *testing.T) {
	tests := []struct {
		name    string
		code    int
		body    string
		want    APIError
		wantMsg string
	}{
		{"one error", 409, `{"error":{"code":409,"message":"The resource 'x' already exists","errors":[{"message":"The resource 'x' already exists","domain":"global","reason":"alreadyExists"}]}}`,
			APIError{Code: 409, Message: "The resource 'x' already exists", Reasons: []string{"alreadyExists"}},
			"HTTP 409 alreadyExists: The resource 'x' already exists"},
		{"several errors", 400, `{"error":{"code":400,"message":"bad","errors":[{"reason":"invalid"},{"reason":"required"}]}}`,
			APIError{Code: 400, Message: "bad", Reasons: []string{"invalid", "required"}}, "HTTP 400 invalid, required: bad"},
		{"status, no errors", 404, `{"error":{"code":404,"message":"Not found","status":"NOT_FOUND"}}`,
			APIError{Code: 404, Message: "Not found", Status: "NOT_FOUND"}, "HTTP 404 NOT_FOUND: Not found"},
		{"message only in the errors", 412, `{"error":{"errors":[{"reason":"conditionNotMet","message":"Precondition not met"}]}}`,
			APIError{Code: 412, Message: "Precondition not met", Reasons: []string{"conditionNotMet"}}, "HTTP 412 conditionNotMet: Precondition not met"},
		{"the status wins over error.code", 503, `{"error":{"code":500,"message":"backend"}}`,
			APIError{Code: 503, Message: "backend"}, "HTTP 503: backend"},
		{"not JSON", 502, "<html>Bad Gateway</html>\n", APIError{Code: 502, Message: `"<html>Bad Gateway</html>"`}, `HTTP 502: "<html>Bad Gateway</html>"`},
		{"JSON without an error", 500, `{"kind":"compute#disk"}`, APIError{Code: 500, Message: `"{\"kind\":\"compute#disk\"}"`}, `HTTP 500: "{\"kind\":\"compute#disk\"}"`},
		{"empty", 401, "", APIError{Code: 401}, "HTTP 401"},
		{"long and binary", 500, strings.Repeat("x\x00", 150), APIError{Code: 500, Message: `"` + strings.Repeat(`x\x00`, 100) + `"…`}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := decodeAPIError(tt.code, []byte(tt.body))
			if got.Code != tt.want.Code || got.Message != tt.want.Message || got.Status != tt.want.Status || !slices.Equal(got.Reasons, tt.want.Reasons) {
				t.Errorf("decodeAPIError = %+v, want %+v", *got, tt.want)
			}
			if tt.wantMsg != "" && got.Error() != tt.wantMsg {
				t.Errorf("Error() = %q, want %q", got.Error(), tt.wantMsg)
			}
		})
	}
}

// answer is one answer of a scripted API server: a status and a body; status 0 drops the
// connection without an answer.
type answer struct {
	status int
	body   string
}

// scripted is an API server that gives its answers in order, the last one again once
// they are used up, and keeps the requests.
type scripted struct {
	answers []answer

	mu       sync.Mutex
	requests []*http.Request
	bodies   []string
}

func (s *scripted) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	n := len(s.requests)
	s.requests = append(s.requests, r)
	s.bodies = append(s.bodies, string(body))
	s.mu.Unlock()
	a := s.answers[min(n, len(s.answers)-1)]
	if a.status == 0 {
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			conn.Close()
		}
		return
	}
	w.Header().Set("Content-Type", "application/json; charset=UTF-8")
	w.WriteHeader(a.status)
	io.WriteString(w, a.body)
}

func (s *scripted) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.requests)
}

// googleErr is a Google JSON error answer.
func googleErr(code int, reason string) answer {
	b, _ := json.Marshal(map[string]any{"error": map[string]any{"code": code, "message": "scripted " + reason,
		"errors": []map[string]string{{"message": "scripted " + reason, "reason": reason}}}})
	return answer{code, string(b)}
}

// TestAPIRetry: a 429, a 5xx and a dropped connection are tried again, up to apiAttempts
// attempts; other errors are not.
func TestAPIRetry(t *testing.T) {
	const disk = `{"name":"d","selfLink":"https://www.googleapis.com/compute/v1/projects/p/zones/z/disks/d"}`
	tests := []struct {
		name         string
		answers      []answer
		wantAttempts int
		wantCode     int    // the *APIError's, when the call fails with one
		wantErr      string // "" for success
	}{
		{"answered", []answer{{200, disk}}, 1, 0, ""},
		{"503, then answered", []answer{googleErr(503, "backendError"), {200, disk}}, 2, 0, ""},
		{"429 twice, then answered", []answer{googleErr(429, "rateLimitExceeded"), googleErr(429, "rateLimitExceeded"), {200, disk}}, 3, 0, ""},
		{"connection dropped, then answered", []answer{{0, ""}, {200, disk}}, 2, 0, ""},
		{"500 every time", []answer{googleErr(500, "backendError")}, apiAttempts, 500, "gave up after 5 attempts"},
		{"404", []answer{googleErr(404, "notFound")}, 1, 404, "HTTP 404 notFound: scripted notFound"},
		{"409", []answer{googleErr(409, "alreadyExists")}, 1, 409, "alreadyExists"},
		{"412", []answer{googleErr(412, "conditionNotMet")}, 1, 412, "conditionNotMet"},
		{"401", []answer{googleErr(401, "required")}, 1, 401, "HTTP 401"},
		{"not JSON", []answer{{200, "<html>"}}, 1, 0, "decode the answer"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := &scripted{answers: tt.answers}
			srv := httptest.NewServer(s)
			defer srv.Close()
			svc, err := newComputeService(srv.URL+"/compute/v1/", staticToken("t"))
			if err != nil {
				t.Fatal(err)
			}
			fastRetry(svc.api)
			d, err := svc.getDisk(context.Background(), "p", "z", "d")
			if got := s.count(); got != tt.wantAttempts {
				t.Errorf("%d attempts, want %d", got, tt.wantAttempts)
			}
			if tt.wantErr == "" {
				if err != nil || d.Name != "d" {
					t.Errorf("getDisk = %+v, %v", d, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !strings.Contains(err.Error(), "GET "+srv.URL+"/compute/v1/projects/p/zones/z/disks/d: ") {
				t.Fatalf("getDisk error %v; want the method, the URL and %q", err, tt.wantErr)
			}
			var ae *APIError
			if got := errors.As(err, &ae); got != (tt.wantCode != 0) || got && ae.Code != tt.wantCode {
				t.Errorf("error %v: *APIError %v, want code %d", err, ae, tt.wantCode)
			}
			if isNotFound(err) != (tt.wantCode == 404) {
				t.Errorf("isNotFound(%v) = %v", err, isNotFound(err))
			}
		})
	}
}

// TestAPIRequest: what each request carries: the bearer token (none without a token
// source, and no request at all when the token cannot be had), the API version Compute
// Engine is asked for, a JSON body.
func TestAPIRequest(t *testing.T) {
	const op = `{"name":"operation-1","status":"RUNNING"}`
	tests := []struct {
		name       string
		tokens     tokenSource
		wantAuth   string
		wantErr    string
		wantCalled bool
	}{
		{"token", staticToken("ya29.kiln"), "Bearer ya29.kiln", "", true},
		{"no token source", nil, "", "", true},
		{"token not to be had", failingToken{}, "", "access token: GCE metadata instance/service-accounts/default/token: not defined", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := &scripted{answers: []answer{{200, op}}}
			srv := httptest.NewServer(s)
			defer srv.Close()
			svc, err := newComputeService(srv.URL+"/compute/v1/", tt.tokens)
			if err != nil {
				t.Fatal(err)
			}
			got, err := svc.attachDisk(context.Background(), "p", "z", "cp-a", "0b0e9c5e-3f5a-4e8e-9d6b-2c7a4f0e1d3c",
				computeAttachedDisk{Source: "projects/p/zones/z/disks/d", DeviceName: "d", Mode: "READ_WRITE", Type: "PERSISTENT"})
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Errorf("attachDisk error %v, want %q", err, tt.wantErr)
				}
			} else if err != nil || got.Name != "operation-1" {
				t.Errorf("attachDisk = %+v, %v", got, err)
			}
			if !tt.wantCalled {
				if s.count() != 0 {
					t.Errorf("%d requests sent without a token", s.count())
				}
				return
			}
			if s.count() != 1 {
				t.Fatalf("%d requests, want 1", s.count())
			}
			r, body := s.requests[0], s.bodies[0]
			for h, want := range map[string]string{
				"Authorization": tt.wantAuth, "X-Goog-Api-Version": computeAPIVersion, "Content-Type": "application/json", "User-Agent": "kiln-init",
			} {
				if got := r.Header.Get(h); got != want {
					t.Errorf("%s: %q, want %q", h, got, want)
				}
			}
			if r.Method != http.MethodPost || r.URL.Path != "/compute/v1/projects/p/zones/z/instances/cp-a/attachDisk" ||
				r.URL.Query().Get("requestId") != "0b0e9c5e-3f5a-4e8e-9d6b-2c7a4f0e1d3c" {
				t.Errorf("request %s %s", r.Method, r.URL)
			}
			if want := `{"source":"projects/p/zones/z/disks/d","deviceName":"d","mode":"READ_WRITE","type":"PERSISTENT"}`; body != want {
				t.Errorf("body %s, want %s", body, want)
			}
		})
	}
}

// TestAttachDiskRequestID: another attempt of attachDisk carries the same request ID, a
// version 4 UUID, so Compute Engine does not take it twice; another attach, another ID.
func TestAttachDiskRequestID(t *testing.T) {
	s := &scripted{answers: []answer{googleErr(503, "backendError"), {200, `{"name":"operation-1","status":"DONE"}`}}}
	srv := httptest.NewServer(s)
	defer srv.Close()
	svc, err := newComputeService(srv.URL+"/compute/v1/", staticToken("t"))
	if err != nil {
		t.Fatal(err)
	}
	fastRetry(svc.api)
	g := Disk{Service: svc, Project: "p", Zone: "z", Instance: "cp-a", DiskName: "d", Log: quiet}
	disk := &computeDisk{Name: "d", SelfLink: "https://www.googleapis.com/compute/v1/projects/p/zones/z/disks/d"}
	if err := g.attach(context.Background(), disk, "d"); err != nil {
		t.Fatal(err)
	}
	if err := g.attach(context.Background(), disk, "d"); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, r := range s.requests {
		ids = append(ids, r.URL.Query().Get("requestId"))
	}
	uuid4 := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	if len(ids) != 3 || ids[0] != ids[1] || ids[1] == ids[2] || !uuid4.MatchString(ids[0]) || !uuid4.MatchString(ids[2]) {
		t.Errorf("request IDs %q; want one UUID for both attempts of the first attach, another for the second", ids)
	}
}

// TestAPIPages: a list follows nextPageToken to the last page, keeping its query.
func TestAPIPages(t *testing.T) {
	pages := map[string]string{
		"":   `{"items":[{"name":"a"},{"name":"b"}],"nextPageToken":"p2"}`,
		"p2": `{"items":[{"name":"c"}],"nextPageToken":"p3"}`,
		"p3": `{"items":[]}`,
	}
	var (
		mu      sync.Mutex
		filters []string
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		filters = append(filters, r.URL.Query().Get("filter"))
		mu.Unlock()
		io.WriteString(w, pages[r.URL.Query().Get("pageToken")])
	}))
	defer srv.Close()
	svc, err := newComputeService(srv.URL+"/compute/v1/", nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	err = svc.listDisks(context.Background(), "p", "z", "(labels.a:*)", func(disks []computeDisk) {
		for _, d := range disks {
			names = append(names, d.Name)
		}
	})
	mu.Lock()
	defer mu.Unlock()
	if err != nil || !slices.Equal(names, []string{"a", "b", "c"}) || !slices.Equal(filters, []string{"(labels.a:*)", "(labels.a:*)", "(labels.a:*)"}) {
		t.Errorf("listDisks = %q, %v (filters %q)", names, err, filters)
	}
}

// hostileAPI is an API whose answer never ends.
type hostileAPI struct{ testkit.Streamer }

func (h *hostileAPI) ServeHTTP(w http.ResponseWriter, _ *http.Request) { h.Stream(w) }

// TestAPIAnswerTooLarge: an answer over maxAPIAnswer is refused after reading no more than
// that, and not asked for again.
func TestAPIAnswerTooLarge(t *testing.T) {
	h := &hostileAPI{Streamer: testkit.Streamer{Total: 4 * maxAPIAnswer}}
	srv := httptest.NewServer(h)
	defer srv.Close()
	svc, err := newDNSService(srv.URL+"/", nil)
	if err != nil {
		t.Fatal(err)
	}
	before := testkit.HeapAllocated()
	err = svc.createChange(context.Background(), "p", "z", &dnsChange{})
	grown := testkit.HeapAllocated() - before
	if err == nil || !strings.Contains(err.Error(), "larger than 32 MiB") {
		t.Fatalf("createChange = %v; want the answer refused as too large", err)
	}
	h.CheckStopped(t, grown, maxAPIAnswer)
}

// TestDNSRecordSetJSON: a record set read from Cloud DNS is written back in a change as
// Cloud DNS gave it, fields kiln does not know included; a new one has the fields it is
// given.
func TestDNSRecordSetJSON(t *testing.T) {
	tests := []struct {
		name string
		set  func(t *testing.T) dnsRecordSet
		want string
	}{
		{"read", func(t *testing.T) dnsRecordSet {
			var s dnsRecordSet
			in := `{"kind":"dns#resourceRecordSet","name":"api.example.test.","type":"A","ttl":60,"rrdatas":["10.0.0.5"],"routingPolicy":{"wrr":{"items":[{"weight":1}]}}}`
			if err := json.Unmarshal([]byte(in), &s); err != nil {
				t.Fatal(err)
			}
			if s.Name != "api.example.test." || s.Type != "A" || s.TTL != 60 || !slices.Equal(s.Rrdatas, []string{"10.0.0.5"}) {
				t.Errorf("decoded %+v", s)
			}
			return s
		}, `{"kind":"dns#resourceRecordSet","name":"api.example.test.","type":"A","ttl":60,"rrdatas":["10.0.0.5"],"routingPolicy":{"wrr":{"items":[{"weight":1}]}}}`},
		{"new", func(*testing.T) dnsRecordSet {
			return dnsRecordSet{Name: "api.example.test.", Type: "AAAA", TTL: 30, Rrdatas: []string{"fd00::5"}}
		}, `{"name":"api.example.test.","type":"AAAA","ttl":30,"rrdatas":["fd00::5"]}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := json.Marshal(dnsChange{Deletions: []dnsRecordSet{tt.set(t)}})
			if want := `{"deletions":[` + tt.want + `]}`; err != nil || string(b) != want {
				t.Errorf("change = %s, %v\n  want %s", b, err, want)
			}
		})
	}
}
