package qemutests

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// fakeIMDS is the EC2 instance metadata service of an instance that requires IMDSv2: a GET
// without a session token from PUT /latest/api/token is refused with 401, as is a token
// that expired; a PUT carrying X-Forwarded-For (a request relayed by a proxy) is refused
// with 403. It serves the user data, the instance's identity and the instance role's
// credentials.
type fakeIMDS struct {
	userData                 []byte
	instanceID, az, hostname string
	role                     string
	creds                    roleCreds

	mu      sync.Mutex
	tokens  map[string]time.Time // token → expiry
	refused []string             // "METHOD path (why)" of refused requests
	served  []string             // paths served
}

func (f *fakeIMDS) region() string { return strings.TrimRight(f.az, "abcdefghijklmnopqrstuvwxyz") }

func (f *fakeIMDS) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	refuse := func(status int, why string) {
		f.refused = append(f.refused, r.Method+" "+r.URL.Path+" ("+why+")")
		w.WriteHeader(status)
	}
	if r.Method == http.MethodPut && r.URL.Path == "/latest/api/token" {
		ttl, err := strconv.Atoi(r.Header.Get("X-aws-ec2-metadata-token-ttl-seconds"))
		switch {
		case r.Header.Get("X-Forwarded-For") != "":
			refuse(http.StatusForbidden, "X-Forwarded-For")
		case err != nil || ttl < 1 || ttl > 21600:
			refuse(http.StatusBadRequest, "token TTL not 1..21600 seconds")
		default:
			b := make([]byte, 24)
			rand.Read(b)
			tok := hex.EncodeToString(b)
			if f.tokens == nil {
				f.tokens = map[string]time.Time{}
			}
			f.tokens[tok] = time.Now().Add(time.Duration(ttl) * time.Second)
			w.Header().Set("X-aws-ec2-metadata-token-ttl-seconds", strconv.Itoa(ttl))
			w.Write([]byte(tok))
		}
		return
	}
	if r.Method != http.MethodGet {
		refuse(http.StatusMethodNotAllowed, "method")
		return
	}
	if exp, ok := f.tokens[r.Header.Get("X-aws-ec2-metadata-token")]; !ok || time.Now().After(exp) {
		refuse(http.StatusUnauthorized, "no valid session token")
		return
	}
	body, ok := f.answer(r.URL.Path)
	if !ok {
		http.NotFound(w, r)
		return
	}
	f.served = append(f.served, r.URL.Path)
	w.Header().Set("Content-Type", "text/plain")
	w.Write(body)
}

// answer is the metadata at path.
func (f *fakeIMDS) answer(path string) ([]byte, bool) {
	md, isMeta := strings.CutPrefix(path, "/latest/meta-data/")
	switch {
	case path == "/latest/user-data":
		return f.userData, f.userData != nil
	case path == "/latest/dynamic/instance-identity/document":
		b, _ := json.Marshal(map[string]string{"instanceId": f.instanceID, "availabilityZone": f.az, "region": f.region(),
			"accountId": "123456789012", "architecture": "x86_64", "imageId": "ami-0kiln", "instanceType": "m7i.large",
			"version": "2017-09-30"})
		return b, true
	case !isMeta:
		return nil, false
	}
	switch md {
	case "instance-id":
		return []byte(f.instanceID), true
	case "placement/availability-zone":
		return []byte(f.az), true
	case "placement/region":
		return []byte(f.region()), true
	case "local-hostname", "hostname":
		return []byte(f.hostname), true
	case "iam/security-credentials", "iam/security-credentials/":
		return []byte(f.role), true
	case "iam/security-credentials/" + f.role:
		now := time.Now().UTC()
		b, _ := json.Marshal(map[string]string{"Code": "Success", "LastUpdated": now.Format(time.RFC3339), "Type": "AWS-HMAC",
			"AccessKeyId": f.creds.key, "SecretAccessKey": f.creds.secret, "Token": f.creds.token,
			"Expiration": now.Add(6 * time.Hour).Format(time.RFC3339)})
		return b, true
	}
	return nil, false
}
