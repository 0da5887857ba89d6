package cloudfake

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// Refuser is a fake that records the requests it refused: ones the cloud would refuse as
// malformed or unauthorised. Every fake of this package is one.
type Refuser interface {
	http.Handler
	Refused() []string
}

// Serve serves f for the test and, at its end, closes the server and fails the test if f
// refused a request: a client that sends what the cloud refuses is a bug even when the test
// got the answer it looked for.
func Serve(t testing.TB, f Refuser) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(f)
	t.Cleanup(func() {
		srv.Close()
		if refused := f.Refused(); len(refused) > 0 {
			t.Errorf("requests the fake cloud refused: %q", refused)
		}
	})
	return srv
}

var _ = []Refuser{(*EC2)(nil), (*Route53)(nil), (*IMDS)(nil), (*GCEMetadata)(nil), (*Compute)(nil), (*CloudDNS)(nil)}
