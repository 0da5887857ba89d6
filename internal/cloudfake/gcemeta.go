package cloudfake

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"sync"
)

// gceProjectNumber is the project number the GCE metadata fake answers, also in the
// instance's zone (projects/NUMBER/zones/ZONE).
const gceProjectNumber = "123456789012"

// GCEMetadata is a fake of the GCE metadata server, as Compute Engine runs it: a request
// without Metadata-Flavor: Google, or relayed by a proxy (X-Forwarded-For), is refused
// with 403; a method other than GET with 405. Every answer carries Metadata-Flavor:
// Google. It serves the instance's attributes (user-data among them), its identity and
// its default service account's access token under /computeMetadata/v1/; what it has no
// value for is 404.
type GCEMetadata struct {
	// Attributes are the instance's custom metadata (instance/attributes/NAME), such as
	// user-data.
	Attributes map[string]string
	// Project, Zone, Name, ID and Hostname are the instance's; "" for none.
	Project, Zone, Name, ID, Hostname string
	// ServiceAccount is the default service account's email, Token its access token; ""
	// for none.
	ServiceAccount, Token string

	// Mutex guards the fake's records.
	sync.Mutex
	calls   []string
	refused []string
}

// Calls returns the requests the fake answered, "METHOD path", in order.
func (f *GCEMetadata) Calls() []string {
	f.Lock()
	defer f.Unlock()
	return slices.Clone(f.calls)
}

// Refused returns the requests the fake refused, each with the reason.
func (f *GCEMetadata) Refused() []string {
	f.Lock()
	defer f.Unlock()
	return slices.Clone(f.refused)
}

// ServeHTTP implements http.Handler.
func (f *GCEMetadata) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.Lock()
	defer f.Unlock()
	w.Header().Set("Metadata-Flavor", "Google")
	w.Header().Set("Server", "Metadata Server for VM")
	switch {
	case r.Header.Get("Metadata-Flavor") != "Google":
		f.refused = append(f.refused, refusal(r, "no Metadata-Flavor: Google"))
		http.Error(w, "Missing Metadata-Flavor:Google header.", http.StatusForbidden)
		return
	case r.Header.Get("X-Forwarded-For") != "":
		f.refused = append(f.refused, refusal(r, "relayed by a proxy (X-Forwarded-For)"))
		http.Error(w, "Request denied: X-Forwarded-For header present.", http.StatusForbidden)
		return
	case r.Method != http.MethodGet:
		f.refused = append(f.refused, refusal(r, "method"))
		http.Error(w, "Method Not Allowed", http.StatusMethodNotAllowed)
		return
	}
	f.calls = append(f.calls, r.Method+" "+r.URL.Path)
	p, ok := strings.CutPrefix(r.URL.Path, "/computeMetadata/v1/")
	body, found := f.answer(p)
	if !ok || !found {
		http.NotFound(w, r)
		return
	}
	if strings.HasSuffix(p, "/token") {
		w.Header().Set("Content-Type", "application/json")
	} else {
		w.Header().Set("Content-Type", "application/text")
	}
	w.Write(body)
}

// answer is the metadata at p, false when the instance has none.
func (f *GCEMetadata) answer(p string) ([]byte, bool) {
	text := func(s string) ([]byte, bool) { return []byte(s), s != "" }
	if name, ok := strings.CutPrefix(p, "instance/attributes/"); ok {
		v, ok := f.Attributes[name]
		return []byte(v), ok
	}
	switch p {
	case "instance/id":
		return text(f.ID)
	case "instance/name":
		return text(f.Name)
	case "instance/hostname":
		return text(f.Hostname)
	case "instance/zone":
		if f.Zone == "" {
			return nil, false
		}
		return []byte("projects/" + gceProjectNumber + "/zones/" + f.Zone), true
	case "project/project-id":
		return text(f.Project)
	case "project/numeric-project-id":
		return text(gceProjectNumber)
	case "instance/service-accounts/default/email":
		return text(f.ServiceAccount)
	case "instance/service-accounts/default/token":
		b, _ := json.Marshal(map[string]any{"access_token": f.Token, "expires_in": 3599, "token_type": "Bearer"})
		return b, f.Token != ""
	}
	return nil, false
}
