package publish

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/xml"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	"github.com/aws/aws-sdk-go-v2/credentials"
)

const (
	testRegion  = "eu-west-1"
	testAKID    = "AKIDKILNTEST"
	testSecret  = "kiln-test-secret"
	testAccount = "111122223333"
)

// fakeAWS answers EBS direct (REST-JSON) and EC2 (Query, XML) as AWS does, for the calls
// kiln publish aws makes, in every region: the region and the service of a request are those
// of its SigV4 credential scope, whose signature it checks. It keeps snapshots and images,
// checks what EBS and EC2 check, and fails calls as its faults say.
type fakeAWS struct {
	t       testing.TB
	mu      sync.Mutex
	regions map[string]*fakeRegion
	next    int
	calls   map[string]int // by operation, including the failed ones
	faults  []*fault
}

type fakeRegion struct {
	snapshots map[string]*fakeSnap
	images    map[string]*fakeImage
}

type fakeSnap struct {
	id, state, description string
	gib                    int64
	tags                   map[string]string
	blocks                 map[int32][]byte
	digests                map[int32][]byte // raw SHA-256 of each block put
	looks                  int              // DescribeSnapshots answers since completion
	volumePerm             []string
}

type fakeImage struct {
	id, name, state, snapshot string
	gib                       int64
	tags                      map[string]string
	looks                     int
	launchPerm                []string
	params                    url.Values // the RegisterImage or CopyImage request
}

// A fault makes the calls of op fail: after calls have gone through, times times (-1:
// always), with status and code, or by cutting the connection.
type fault struct {
	op                string
	after, times      int
	status            int
	code, msg, reason string
	cut               bool
}

func newFakeAWS(t testing.TB) *fakeAWS {
	return &fakeAWS{t: t, regions: map[string]*fakeRegion{}, calls: map[string]int{}}
}

// start serves f over TLS and returns an AWS publisher whose clients call it.
func (f *fakeAWS) start() *AWS {
	srv := httptest.NewUnstartedServer(f)
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // connections the faults cut
	srv.StartTLS()
	f.t.Cleanup(srv.Close)
	a := NewAWS(AWSConfig{
		Config: aws.Config{
			Region:      testRegion,
			Credentials: credentials.NewStaticCredentialsProvider(testAKID, testSecret, ""),
			HTTPClient:  srv.Client(),
		},
		Endpoint:   srv.URL,
		MaxBackoff: 20 * time.Millisecond,
	})
	a.Poll, a.MaxWait = time.Millisecond, 10*time.Second
	a.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	return a
}

func (f *fakeAWS) region(name string) *fakeRegion {
	r := f.regions[name]
	if r == nil {
		r = &fakeRegion{snapshots: map[string]*fakeSnap{}, images: map[string]*fakeImage{}}
		f.regions[name] = r
	}
	return r
}

func (f *fakeAWS) id(prefix string) string {
	f.next++
	return fmt.Sprintf("%s-%017x", prefix, f.next)
}

var authRE = regexp.MustCompile(`^AWS4-HMAC-SHA256 Credential=([^/]+)/(\d{8})/([^/]+)/([^/]+)/aws4_request, SignedHeaders=([^,]+), Signature=[0-9a-f]{64}$`)

func (f *fakeAWS) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return
	}
	region, service, err := verifySigV4(r, body)
	if err != nil {
		f.t.Errorf("%s %s not signed as AWS would accept: %v", r.Method, r.URL.Path, err)
		w.WriteHeader(http.StatusForbidden)
		return
	}
	var op string
	var form url.Values
	if service == "ec2" {
		form, _ = url.ParseQuery(string(body))
		op = form.Get("Action")
		if r.Method != http.MethodPost || form.Get("Version") != "2016-11-15" {
			f.t.Errorf("EC2 %s %s: %s, Version %q: not a Query API call", op, r.Method, r.URL.Path, form.Get("Version"))
		}
	} else {
		op = ebsOp(r)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls[op]++
	if f.fail(w, service, op) {
		return
	}
	reg := f.region(region)
	if service == "ec2" {
		f.ec2(w, reg, region, op, form)
		return
	}
	f.ebs(w, reg, op, r, body)
}

// fail answers the call with a fault's error, if one applies, and says whether it did.
func (f *fakeAWS) fail(w http.ResponseWriter, service, op string) bool {
	for _, ft := range f.faults {
		if ft.op != op {
			continue
		}
		if ft.after > 0 {
			ft.after--
			continue
		}
		if ft.times == 0 {
			continue
		}
		if ft.times > 0 {
			ft.times--
		}
		if ft.cut {
			conn, _, err := w.(http.Hijacker).Hijack()
			if err != nil {
				f.t.Fatalf("hijack: %v", err)
			}
			conn.Close()
			return true
		}
		if service == "ec2" {
			ec2Error(w, ft.status, ft.code, ft.msg)
		} else {
			ebsError(w, ft.status, ft.code, ft.msg, ft.reason)
		}
		return true
	}
	return false
}

// verifySigV4 checks r's signature with the test credentials and returns its scope's
// region and service.
func verifySigV4(r *http.Request, body []byte) (region, service string, err error) {
	auth := r.Header.Get("Authorization")
	m := authRE.FindStringSubmatch(auth)
	if m == nil {
		return "", "", fmt.Errorf("Authorization %q is not SigV4", auth)
	}
	if m[1] != testAKID {
		return "", "", fmt.Errorf("access key %s", m[1])
	}
	when, err := time.Parse("20060102T150405Z", r.Header.Get("X-Amz-Date"))
	if err != nil {
		return "", "", fmt.Errorf("X-Amz-Date: %w", err)
	}
	check, err := http.NewRequest(r.Method, "https://"+r.Host+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		return "", "", err
	}
	check.ContentLength = r.ContentLength
	for _, h := range strings.Split(m[5], ";") {
		if h != "host" && h != "content-length" {
			check.Header[http.CanonicalHeaderKey(h)] = r.Header.Values(h)
		}
	}
	payload := r.Header.Get("X-Amz-Content-Sha256")
	if payload == "" {
		sum := sha256.Sum256(body)
		payload = hex.EncodeToString(sum[:])
	}
	creds := aws.Credentials{AccessKeyID: testAKID, SecretAccessKey: testSecret}
	if err := v4.NewSigner().SignHTTP(context.Background(), creds, check, payload, m[4], m[3], when); err != nil {
		return "", "", err
	}
	if got := check.Header.Get("Authorization"); got != auth {
		return "", "", fmt.Errorf("signature mismatch:\n got  %s\n want %s", auth, got)
	}
	return m[3], m[4], nil
}

var (
	blockPath    = regexp.MustCompile(`^/snapshots/([^/]+)/blocks/(\d+)$`)
	completePath = regexp.MustCompile(`^/snapshots/completion/([^/]+)$`)
)

// ebsOp names the EBS direct API call r makes.
func ebsOp(r *http.Request) string {
	switch {
	case r.Method == http.MethodPost && r.URL.Path == "/snapshots":
		return "StartSnapshot"
	case r.Method == http.MethodPut && blockPath.MatchString(r.URL.Path):
		return "PutSnapshotBlock"
	case r.Method == http.MethodPost && completePath.MatchString(r.URL.Path):
		return "CompleteSnapshot"
	}
	return r.Method + " " + r.URL.Path
}

func ebsError(w http.ResponseWriter, status int, code, msg, reason string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Amzn-Errortype", code)
	w.WriteHeader(status)
	doc := map[string]string{"Message": msg}
	if reason != "" {
		doc["Reason"] = reason
	}
	json.NewEncoder(w).Encode(doc)
}

func ec2Error(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "text/xml;charset=UTF-8")
	w.WriteHeader(status)
	fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?>
<Response><Errors><Error><Code>%s</Code><Message>%s</Message></Error></Errors><RequestID>req-err</RequestID></Response>`, code, xmlEscape(msg))
}

func xmlEscape(s string) string {
	var b bytes.Buffer
	xml.EscapeText(&b, []byte(s))
	return b.String()
}

// indexed returns the values of prefix.1, prefix.2, … (the Query API's lists).
func indexed(form url.Values, prefix string) []string {
	var out []string
	for i := 1; form.Has(prefix + "." + strconv.Itoa(i)); i++ {
		out = append(out, form.Get(prefix+"."+strconv.Itoa(i)))
	}
	return out
}

// tagsOf reads the tags of TagSpecification entries of resource type rt.
func tagsOf(form url.Values, rt string) map[string]string {
	tags := map[string]string{}
	for i := 1; form.Has(fmt.Sprintf("TagSpecification.%d.ResourceType", i)); i++ {
		if form.Get(fmt.Sprintf("TagSpecification.%d.ResourceType", i)) != rt {
			continue
		}
		for j := 1; form.Has(fmt.Sprintf("TagSpecification.%d.Tag.%d.Key", i, j)); j++ {
			tags[form.Get(fmt.Sprintf("TagSpecification.%d.Tag.%d.Key", i, j))] = form.Get(fmt.Sprintf("TagSpecification.%d.Tag.%d.Value", i, j))
		}
	}
	return tags
}

// snapshotBlocks returns the blocks of the snapshot id in region by index, and how many
// blocks its volume has; blocks never put read as zeros.
func (f *fakeAWS) snapshotBlocks(region, id string) (map[int32][]byte, int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.region(region).snapshots[id]
	if s == nil {
		f.t.Fatalf("no snapshot %s in %s", id, region)
	}
	return s.blocks, s.gib << 30 / blockSize
}

// count is how many snapshots and images the account has in region.
func (f *fakeAWS) count(region string) (snapshots, images int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r := f.region(region)
	return len(r.snapshots), len(r.images)
}

func (f *fakeAWS) callsOf(op string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[op]
}

func (f *fakeAWS) image(region, id string) *fakeImage {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.region(region).images[id]
}

func (f *fakeAWS) snapshot(region, id string) *fakeSnap {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.region(region).snapshots[id]
}

// digestOf is the base64 SHA-256 of b, as EBS writes checksums.
func digestOf(b []byte) string {
	sum := sha256.Sum256(b)
	return base64.StdEncoding.EncodeToString(sum[:])
}

func sortedKeys(m map[string]string) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}
