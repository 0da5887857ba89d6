package cloudfake

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// IMDS is a fake of the EC2 instance metadata service of an instance that requires IMDSv2
// (HttpTokens=required), as EC2 runs it. PUT /latest/api/token with a TTL of 1 to 21600
// seconds hands out a session token; it is refused with 400 without a valid TTL, and with
// 403 when a proxy relayed it (X-Forwarded-For). Every GET must carry a token that has not
// expired, else 401; other methods are refused with 405. It serves the user data, the
// instance's identity document and metadata, and the instance role's credentials; what it
// has no value for is 404.
type IMDS struct {
	// UserData is the instance's user data; nil for none.
	UserData []byte
	// InstanceID, AZ (its region is AZ without the zone letter) and Hostname are the
	// instance's; "" for none.
	InstanceID, AZ, Hostname string
	// Role is the instance role, Creds its temporary credentials; "" for none.
	Role  string
	Creds AWSCredentials
	// Status maps a path to the HTTP status the service answers a GET of it with instead
	// (a failing or throttled service).
	Status map[string]int
	// V1Only makes the fake a service without IMDSv2: a token request it does not refuse
	// for the reasons above is 404, and GETs need no token.
	V1Only bool

	// Mutex guards the fake's records.
	sync.Mutex
	tokens  map[string]time.Time // token → expiry
	calls   []string
	refused []string
}

const imdsTokenPath = "/latest/api/token"

// Calls returns the requests the fake answered, "METHOD path", in order.
func (f *IMDS) Calls() []string {
	f.Lock()
	defer f.Unlock()
	return slices.Clone(f.calls)
}

// Refused returns the requests the fake refused, each with the reason.
func (f *IMDS) Refused() []string {
	f.Lock()
	defer f.Unlock()
	return slices.Clone(f.refused)
}

// region is the instance's region: its availability zone without the zone letter.
func (f *IMDS) region() string { return strings.TrimRight(f.AZ, "abcdefghijklmnopqrstuvwxyz") }

// ServeHTTP implements http.Handler.
func (f *IMDS) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.Lock()
	defer f.Unlock()
	w.Header().Set("Server", "EC2ws")
	refuse := func(status int, why string) {
		f.refused = append(f.refused, refusal(r, why))
		http.Error(w, http.StatusText(status), status)
	}
	if r.Method == http.MethodPut && r.URL.Path == imdsTokenPath {
		ttl, err := strconv.Atoi(r.Header.Get("X-aws-ec2-metadata-token-ttl-seconds"))
		switch {
		case r.Header.Get("X-Forwarded-For") != "":
			refuse(http.StatusForbidden, "token request relayed by a proxy (X-Forwarded-For)")
			return
		case err != nil || ttl < 1 || ttl > 21600:
			refuse(http.StatusBadRequest, "token TTL not 1 to 21600 seconds")
			return
		}
		f.calls = append(f.calls, r.Method+" "+r.URL.Path)
		if f.V1Only {
			http.NotFound(w, r)
			return
		}
		b := make([]byte, 30)
		rand.Read(b)
		tok := base64.StdEncoding.EncodeToString(b)
		if f.tokens == nil {
			f.tokens = map[string]time.Time{}
		}
		f.tokens[tok] = time.Now().Add(time.Duration(ttl) * time.Second)
		w.Header().Set("X-aws-ec2-metadata-token-ttl-seconds", strconv.Itoa(ttl))
		w.Header().Set("Content-Type", "text/plain")
		w.Write([]byte(tok))
		return
	}
	if r.Method != http.MethodGet {
		refuse(http.StatusMethodNotAllowed, "method")
		return
	}
	if exp, ok := f.tokens[r.Header.Get("X-aws-ec2-metadata-token")]; !f.V1Only && (!ok || time.Now().After(exp)) {
		refuse(http.StatusUnauthorized, "no valid session token")
		return
	}
	f.calls = append(f.calls, r.Method+" "+r.URL.Path)
	if status := f.Status[r.URL.Path]; status != 0 {
		http.Error(w, http.StatusText(status), status)
		return
	}
	body, ok := f.answer(r.URL.Path)
	if !ok {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", "text/plain")
	w.Write(body)
}

// answer is the metadata at path, false when the instance has none.
func (f *IMDS) answer(path string) ([]byte, bool) {
	text := func(s string) ([]byte, bool) { return []byte(s), s != "" }
	md, isMeta := strings.CutPrefix(path, "/latest/meta-data/")
	switch {
	case path == "/latest/user-data":
		return f.UserData, f.UserData != nil
	case path == "/latest/dynamic/instance-identity/document":
		b, _ := json.Marshal(map[string]string{"instanceId": f.InstanceID, "availabilityZone": f.AZ, "region": f.region(),
			"accountId": "123456789012", "architecture": "x86_64", "imageId": "ami-0kiln", "instanceType": "m7i.large",
			"version": "2017-09-30"})
		return b, f.InstanceID != "" && f.AZ != ""
	case !isMeta:
		return nil, false
	}
	switch md {
	case "instance-id":
		return text(f.InstanceID)
	case "placement/availability-zone":
		return text(f.AZ)
	case "placement/region":
		return text(f.region())
	case "local-hostname", "hostname":
		return text(f.Hostname)
	case "iam/security-credentials", "iam/security-credentials/":
		return text(f.Role)
	case "iam/security-credentials/" + f.Role:
		if f.Role == "" {
			return nil, false
		}
		now := time.Now().UTC()
		b, _ := json.Marshal(map[string]string{"Code": "Success", "LastUpdated": now.Format(time.RFC3339), "Type": "AWS-HMAC",
			"AccessKeyId": f.Creds.AccessKeyID, "SecretAccessKey": f.Creds.SecretAccessKey, "Token": f.Creds.SessionToken,
			"Expiration": now.Add(6 * time.Hour).Format(time.RFC3339)})
		return b, true
	}
	return nil, false
}
