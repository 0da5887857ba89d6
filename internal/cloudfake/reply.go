package cloudfake

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"net/http"
	"strings"
)

// refusal is how a fake records refused request r: "METHOD path: why".
func refusal(r *http.Request, why string) string {
	return r.Method + " " + r.URL.Path + ": " + why
}

// bearerRefusal is why a fake refuses a request whose Authorization is auth.
func bearerRefusal(auth string) string {
	if !strings.HasPrefix(auth, "Bearer ") {
		return "no bearer token"
	}
	return "another bearer token"
}

// xmlText escapes s for XML character data.
func xmlText(s string) string {
	var b bytes.Buffer
	xml.EscapeText(&b, []byte(s))
	return b.String()
}

// reverseLabels is name with its labels reversed and no trailing dot ("www.example.com."
// becomes "com.example.www"), lower case: the order Route 53 lists names in.
func reverseLabels(name string) string {
	labels := strings.Split(strings.ToLower(strings.TrimSuffix(name, ".")), ".")
	for i, j := 0, len(labels)-1; i < j; i, j = i+1, j-1 {
		labels[i], labels[j] = labels[j], labels[i]
	}
	return strings.Join(labels, ".")
}

// googleJSON answers v as a Google API does.
func googleJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json; charset=UTF-8")
	json.NewEncoder(w).Encode(v)
}

// googleError answers a Google API error: HTTP status code, message and reason ("notFound",
// "required", …), as googleapi.Error reads it.
func googleError(w http.ResponseWriter, code int, msg, reason string) {
	w.Header().Set("Content-Type", "application/json; charset=UTF-8")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"code": code, "message": msg,
		"errors": []map[string]string{{"message": msg, "domain": "global", "reason": reason}}}})
}
