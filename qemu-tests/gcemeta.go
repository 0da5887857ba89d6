package qemutests

import (
	"encoding/json"
	"net/http"
	"strings"
	"sync"
)

// fakeGCEMetadata is the GCE metadata server: a request without Metadata-Flavor: Google,
// or relayed by a proxy (X-Forwarded-For), is refused with 403; every answer carries
// Metadata-Flavor: Google. It serves the user-data attribute, the instance's identity and
// its default service account's access token.
type fakeGCEMetadata struct {
	userData                     []byte
	project, zone, name, id      string
	hostname, token, serviceAcct string

	mu      sync.Mutex
	refused []string
	served  []string
}

func (f *fakeGCEMetadata) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	w.Header().Set("Metadata-Flavor", "Google")
	w.Header().Set("Server", "Metadata Server for VM")
	if r.Header.Get("Metadata-Flavor") != "Google" || r.Header.Get("X-Forwarded-For") != "" {
		f.refused = append(f.refused, r.Method+" "+r.URL.Path)
		w.WriteHeader(http.StatusForbidden)
		w.Write([]byte("Missing Metadata-Flavor:Google header.\n"))
		return
	}
	if r.Method != http.MethodGet {
		w.WriteHeader(http.StatusMethodNotAllowed)
		return
	}
	body, ok := f.answer(strings.TrimPrefix(r.URL.Path, "/computeMetadata/v1/"))
	if !ok || !strings.HasPrefix(r.URL.Path, "/computeMetadata/v1/") {
		http.NotFound(w, r)
		return
	}
	f.served = append(f.served, r.URL.Path)
	if strings.HasSuffix(r.URL.Path, "/token") {
		w.Header().Set("Content-Type", "application/json")
	} else {
		w.Header().Set("Content-Type", "application/text")
	}
	w.Write(body)
}

func (f *fakeGCEMetadata) answer(p string) ([]byte, bool) {
	switch p {
	case "instance/attributes/user-data":
		return f.userData, f.userData != nil
	case "instance/id":
		return []byte(f.id), true
	case "instance/name":
		return []byte(f.name), true
	case "instance/hostname":
		return []byte(f.hostname), true
	case "instance/zone":
		return []byte("projects/123456789012/zones/" + f.zone), true
	case "project/project-id":
		return []byte(f.project), true
	case "project/numeric-project-id":
		return []byte("123456789012"), true
	case "instance/service-accounts/default/email":
		return []byte(f.serviceAcct), true
	case "instance/service-accounts/default/token":
		b, _ := json.Marshal(map[string]any{"access_token": f.token, "expires_in": 3599, "token_type": "Bearer"})
		return b, true
	}
	return nil, false
}
