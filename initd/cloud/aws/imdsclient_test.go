package aws

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kilnproject/kiln/internal/cloudfake"
)

// count is how many of calls are call.
func count(calls []string, call string) int {
	n := 0
	for _, c := range calls {
		if c == call {
			n++
		}
	}
	return n
}

const tokenPUT = "PUT /latest/api/token"

// TestIMDSToken: one session token serves the reads while it lives; a new one is fetched
// shortly before it expires, so that no read is refused.
func TestIMDSToken(t *testing.T) {
	f := ec2Instance()
	srv := cloudfake.Serve(t, f)
	c := newIMDSClient(srv.URL, nil)
	ctx := context.Background()
	for range 3 {
		if _, err := c.metadata(ctx, "instance-id"); err != nil {
			t.Fatal(err)
		}
	}
	if n := count(f.Calls(), tokenPUT); n != 1 {
		t.Errorf("%d token requests for 3 reads, want 1: %q", n, f.Calls())
	}

	short := newIMDSClient(srv.URL, nil)
	short.ttl = time.Second
	if _, err := short.metadata(ctx, "instance-id"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(950 * time.Millisecond) // past the renewal, a tenth of the TTL early
	if _, err := short.metadata(ctx, "local-hostname"); err != nil {
		t.Fatal(err)
	}
	if n := count(f.Calls(), tokenPUT); n != 3 {
		t.Errorf("%d token requests, want 3 (one more for the expiring token): %q", n, f.Calls())
	}
}

// scripted is an IMDS that answers the first requests as scripted ("401", "503", "drop")
// and hands the others to the fake.
type scripted struct {
	*cloudfake.IMDS
	gets []string // answers to the first GETs

	mu   sync.Mutex
	seen int
}

func (s *scripted) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	var answer string
	if r.Method == http.MethodGet && s.seen < len(s.gets) {
		answer = s.gets[s.seen]
		s.seen++
	}
	s.mu.Unlock()
	switch answer {
	case "":
		s.IMDS.ServeHTTP(w, r)
	case "drop":
		conn, _, _ := w.(http.Hijacker).Hijack()
		conn.Close()
	case "401":
		http.Error(w, "Unauthorized", http.StatusUnauthorized)
	case "503":
		http.Error(w, "Service Unavailable", http.StatusServiceUnavailable)
	case "404":
		http.NotFound(w, r)
	}
}

// TestIMDSRetries: a 401 (the token expired early) fetches a new token and reads again;
// a 5xx or a dropped connection is tried again; up to imdsAttempts in all.
func TestIMDSRetries(t *testing.T) {
	tests := []struct {
		name       string
		gets       []string
		wantTokens int
		wantErr    string
	}{
		{name: "401 then a new token", gets: []string{"401"}, wantTokens: 2},
		{name: "503 then the answer", gets: []string{"503"}, wantTokens: 1},
		{name: "dropped then the answer", gets: []string{"drop"}, wantTokens: 1},
		{name: "503 throughout", gets: []string{"503", "503", "503"}, wantTokens: 1, wantErr: "IMDS GET /latest/meta-data/instance-id: HTTP 503"},
		{name: "404 is not tried again", gets: []string{"404"}, wantTokens: 1, wantErr: "HTTP 404"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := ec2Instance()
			s := &scripted{IMDS: f, gets: tc.gets}
			srv := cloudfake.Serve(t, s)
			b, err := newIMDSClient(srv.URL, nil).metadata(context.Background(), "instance-id")
			switch {
			case tc.wantErr == "" && (err != nil || string(b) != f.InstanceID):
				t.Errorf("read %q, %v", b, err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Errorf("err = %v, want %q", err, tc.wantErr)
			}
			if n := count(f.Calls(), tokenPUT); n != tc.wantTokens {
				t.Errorf("%d token requests, want %d", n, tc.wantTokens)
			}
			s.mu.Lock()
			defer s.mu.Unlock()
			if tc.wantErr == "" && s.seen != len(tc.gets) {
				t.Errorf("%d scripted answers used of %d", s.seen, len(tc.gets))
			}
		})
	}
}

// TestIMDSTokenRefused: a token request the service refuses is not retried, and is not
// taken for missing data.
func TestIMDSTokenRefused(t *testing.T) {
	f := &cloudfake.IMDS{InstanceID: testInstanceID, UserData: []byte(ign), V1Only: true}
	srv := cloudfake.Serve(t, f)
	_, err := (&IMDS{Endpoint: srv.URL}).Fetch(context.Background())
	if err == nil || !strings.Contains(err.Error(), "IMDS PUT /latest/api/token: HTTP 404") {
		t.Errorf("Fetch = %v; want the refused token", err)
	}
	if calls := f.Calls(); !slices.Equal(calls, []string{tokenPUT}) {
		t.Errorf("calls %q, want one token request", calls)
	}
}

// roleIMDS is the metadata service of an instance with role kiln-node, whose credentials
// carry a session token.
func roleIMDS() *cloudfake.IMDS {
	return &cloudfake.IMDS{InstanceID: "i-0kiln", AZ: "eu-west-1a", Role: "kiln-node",
		Creds: cloudfake.AWSCredentials{AccessKeyID: "ASIAKILNROLE", SecretAccessKey: "kiln-role-secret", SessionToken: "kiln-session"}}
}

// TestRoleCredentials: the role's credentials are read from IMDS once and kept; an
// instance without a role, or an answer that is not a success, is an error naming it.
func TestRoleCredentials(t *testing.T) {
	f := roleIMDS()
	srv := cloudfake.Serve(t, f)
	r := &roleCredentials{imds: newIMDSClient(srv.URL, nil)}
	for range 2 {
		got, err := r.retrieve(context.Background())
		if want := (awsCredentials{"ASIAKILNROLE", "kiln-role-secret", "kiln-session"}); err != nil || got != want {
			t.Fatalf("credentials %+v, %v; want %+v", got, err, want)
		}
	}
	if want := []string{tokenPUT, "GET /latest/meta-data/iam/security-credentials/",
		"GET /latest/meta-data/iam/security-credentials/kiln-node"}; !slices.Equal(f.Calls(), want) {
		t.Errorf("calls %q, want %q (read once)", f.Calls(), want)
	}

	none := cloudfake.Serve(t, ec2Instance())
	if _, err := (&roleCredentials{imds: newIMDSClient(none.URL, nil)}).retrieve(context.Background()); err == nil ||
		!strings.Contains(err.Error(), "instance role credentials: the instance has no instance role") {
		t.Errorf("without a role: %v", err)
	}
}

// roleAnswer is an IMDS whose role credentials answer is body.
type roleAnswer struct {
	*cloudfake.IMDS
	body string
}

func (a roleAnswer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/latest/meta-data/iam/security-credentials/kiln-node" {
		w.Write([]byte(a.body))
		return
	}
	a.IMDS.ServeHTTP(w, r)
}

func TestRoleCredentialsAnswers(t *testing.T) {
	soon := time.Now().Add(2 * time.Minute).UTC().Format(time.RFC3339)
	later := time.Now().Add(6 * time.Hour).UTC().Format(time.RFC3339)
	tests := []struct {
		name      string
		body      string
		wantReads int // of the credentials, for two retrieves
		wantErr   string
	}{
		{name: "kept while valid", body: `{"Code":"Success","AccessKeyId":"A","SecretAccessKey":"S","Token":"T","Expiration":"` + later + `"}`, wantReads: 1},
		{name: "read again when about to expire", body: `{"Code":"Success","AccessKeyId":"A","SecretAccessKey":"S","Token":"T","Expiration":"` + soon + `"}`, wantReads: 2},
		{name: "not a success", body: `{"Code":"AssumeRoleUnauthorizedAccess","Message":"denied"}`, wantReads: 1,
			wantErr: "role kiln-node: IMDS answers AssumeRoleUnauthorizedAccess: denied"},
		{name: "no key", body: `{"Code":"Success","Expiration":"` + later + `"}`, wantReads: 1, wantErr: "answers no access key"},
		{name: "not JSON", body: `<html>`, wantReads: 1, wantErr: "role kiln-node: invalid character"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := roleIMDS()
			srv := cloudfake.Serve(t, roleAnswer{f, tc.body})
			r := &roleCredentials{imds: newIMDSClient(srv.URL, nil)}
			_, err := r.retrieve(context.Background())
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if _, err := r.retrieve(context.Background()); err != nil {
				t.Fatal(err)
			}
			if n := count(f.Calls(), "GET /latest/meta-data/iam/security-credentials/"); n != tc.wantReads {
				t.Errorf("role listed %d times, want %d", n, tc.wantReads)
			}
		})
	}
}

// TestRoleCredentialsKeptWhenIMDSFails: credentials due for renewal but not expired serve
// while IMDS cannot hand out new ones; expired ones do not.
func TestRoleCredentialsKeptWhenIMDSFails(t *testing.T) {
	f := roleIMDS()
	srv := cloudfake.Serve(t, f)
	r := &roleCredentials{imds: newIMDSClient(srv.URL, nil)}
	want, err := r.retrieve(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	f.Lock()
	f.Status = map[string]int{"/latest/meta-data/iam/security-credentials/": http.StatusInternalServerError}
	f.Unlock()
	r.renewAt = time.Now().Add(-time.Second) // due for renewal
	if got, err := r.retrieve(context.Background()); err != nil || got != want {
		t.Errorf("due for renewal: %+v, %v; want the credentials kept", got, err)
	}
	r.expires = time.Now().Add(-time.Second)
	if _, err := r.retrieve(context.Background()); err == nil || !strings.Contains(err.Error(), "HTTP 500") {
		t.Errorf("expired: %v; want IMDS's failure", err)
	}
}

func TestRegionFromIMDS(t *testing.T) {
	tests := []struct {
		az, want, wantErr string
	}{
		{az: "eu-west-1a", want: "eu-west-1"},
		{az: "us-gov-west-1b", want: "us-gov-west-1"},
		{az: "", wantErr: "HTTP 404"},
		{az: "EU.evil.example/x", wantErr: "is not an AWS region name"},
	}
	for _, tc := range tests {
		srv := cloudfake.Serve(t, &cloudfake.IMDS{InstanceID: "i-1", AZ: tc.az})
		got, err := newIMDSClient(srv.URL, nil).region(context.Background())
		if got != tc.want || (tc.wantErr == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("AZ %q: region %q, %v; want %q, %q", tc.az, got, err, tc.want, tc.wantErr)
		}
	}
}
