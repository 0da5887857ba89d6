package publishtest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"encoding/xml"
	"fmt"
	"io"
	"log"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
)

const (
	// AWSAccessKeyID and AWSSecretAccessKey are the only credentials AWS accepts.
	AWSAccessKeyID     = "AKIDKILNTEST"
	AWSSecretAccessKey = "kiln-test-secret"
	// AWSAccount is the account that owns what AWS keeps.
	AWSAccount = "111122223333"
	// EBSBlockSize is the size of an EBS snapshot block.
	EBSBlockSize = 512 << 10
)

// AWS answers EBS direct (REST-JSON) and EC2 (Query, XML) over TLS as AWS does, for the calls
// kiln publish aws makes, in every region: the region and the service of a request are those
// of its SigV4 credential scope, whose signature it checks. It keeps snapshots and images,
// checks what EBS and EC2 check, and fails calls as its faults say.
type AWS struct {
	t       testing.TB
	srv     *httptest.Server
	mu      sync.Mutex
	regions map[string]*regionState
	next    int
	calls   map[string]int // by operation, including the failed ones
	faults  []*Fault
	pending int // Describe answers a completing snapshot or a new image stays pending
}

type regionState struct {
	snapshots map[string]*Snapshot
	images    map[string]*Image
}

// A Snapshot is an EBS snapshot AWS keeps.
type Snapshot struct {
	ID, State, Description string
	GiB                    int64
	Tags                   map[string]string
	Blocks                 map[int32][]byte // the blocks put, by index
	VolumePermission       []string         // the accounts allowed to create volumes from it
	digests                map[int32][]byte // raw SHA-256 of each block put
	looks                  int              // DescribeSnapshots answers since completion
}

// An Image is an AMI AWS keeps.
type Image struct {
	ID, Name, State, SnapshotID string
	GiB                         int64
	Tags                        map[string]string
	LaunchPermission            []string
	Params                      url.Values // the RegisterImage or CopyImage request
	looks                       int
}

// A Fault makes the calls of Op fail: after After calls have gone through, Times times (-1:
// always), with Status and the error Code, Message and (EBS) Reason, or by cutting the
// connection when Cut.
type Fault struct {
	Op                    string
	After, Times          int
	Status                int
	Code, Message, Reason string
	Cut                   bool
}

// NewAWS starts an AWS fake, stopped when the test ends. A new snapshot or image is pending
// for one Describe answer before it completes.
func NewAWS(t testing.TB) *AWS {
	f := &AWS{t: t, regions: map[string]*regionState{}, calls: map[string]int{}, pending: 1}
	f.srv = httptest.NewUnstartedServer(f)
	f.srv.Config.ErrorLog = log.New(io.Discard, "", 0) // connections the faults cut
	f.srv.StartTLS()
	t.Cleanup(f.srv.Close)
	return f
}

// URL is the endpoint of both EBS and EC2, https://127.0.0.1:PORT.
func (f *AWS) URL() string { return f.srv.URL }

// Client is an HTTP client that trusts the fake's certificate.
func (f *AWS) Client() *http.Client { return f.srv.Client() }

// CAFile writes the fake's certificate as PEM into a file of the test's and returns its path,
// for AWS_CA_BUNDLE.
func (f *AWS) CAFile(t testing.TB) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "aws-ca.pem")
	block := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: f.srv.Certificate().Raw})
	if err := os.WriteFile(path, block, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// SetPending sets how many Describe answers a completing snapshot or a new image stays
// pending before it is completed or available.
func (f *AWS) SetPending(n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pending = n
}

// Inject adds faults, applied in the order given to the calls they name.
func (f *AWS) Inject(faults ...Fault) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, ft := range faults {
		f.faults = append(f.faults, &ft)
	}
}

// Unspent is the faults that failed fewer calls than their Times asked, with Times the count
// left.
func (f *AWS) Unspent() []Fault {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []Fault
	for _, ft := range f.faults {
		if ft.Times > 0 {
			out = append(out, *ft)
		}
	}
	return out
}

func (f *AWS) region(name string) *regionState {
	r := f.regions[name]
	if r == nil {
		r = &regionState{snapshots: map[string]*Snapshot{}, images: map[string]*Image{}}
		f.regions[name] = r
	}
	return r
}

func (f *AWS) newID(prefix string) string {
	f.next++
	return fmt.Sprintf("%s-%017x", prefix, f.next)
}

var authRE = regexp.MustCompile(`^AWS4-HMAC-SHA256 Credential=([^/]+)/(\d{8})/([^/]+)/([^/]+)/aws4_request, SignedHeaders=([^,]+), Signature=[0-9a-f]{64}$`)

func (f *AWS) ServeHTTP(w http.ResponseWriter, r *http.Request) {
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
func (f *AWS) fail(w http.ResponseWriter, service, op string) bool {
	for _, ft := range f.faults {
		if ft.Op != op {
			continue
		}
		if ft.After > 0 {
			ft.After--
			continue
		}
		if ft.Times == 0 {
			continue
		}
		if ft.Times > 0 {
			ft.Times--
		}
		if ft.Cut {
			conn, _, err := w.(http.Hijacker).Hijack()
			if err != nil {
				f.t.Errorf("hijack: %v", err)
			}
			conn.Close()
			return true
		}
		if service == "ec2" {
			ec2Error(w, ft.Status, ft.Code, ft.Message)
		} else {
			ebsError(w, ft.Status, ft.Code, ft.Message, ft.Reason)
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
	if m[1] != AWSAccessKeyID {
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
	creds := aws.Credentials{AccessKeyID: AWSAccessKeyID, SecretAccessKey: AWSSecretAccessKey}
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

// SnapshotMatches reports how the snapshot id in region differs from content, block by
// block: blocks never put read as zeros, and so does the volume past content's end.
func (f *AWS) SnapshotMatches(region, id string, content []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.region(region).snapshots[id]
	if s == nil {
		return fmt.Errorf("no snapshot %s in %s", id, region)
	}
	n := s.GiB << 30 / EBSBlockSize
	if n*EBSBlockSize < int64(len(content)) {
		return fmt.Errorf("snapshot %s holds %d blocks, the image is %d bytes", id, n, len(content))
	}
	zero := make([]byte, EBSBlockSize)
	want := make([]byte, EBSBlockSize)
	for i := range n {
		clear(want)
		if off := i * EBSBlockSize; off < int64(len(content)) {
			copy(want, content[off:])
		}
		got := s.Blocks[int32(i)]
		if got == nil {
			got = zero
		}
		if !bytes.Equal(got, want) {
			return fmt.Errorf("snapshot %s differs from the image in block %d", id, i)
		}
	}
	return nil
}

// Count is how many snapshots and images the account has in region.
func (f *AWS) Count(region string) (snapshots, images int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r := f.region(region)
	return len(r.snapshots), len(r.images)
}

// Calls is how many calls of op (StartSnapshot, RegisterImage, …) AWS received, the failed
// ones included.
func (f *AWS) Calls(op string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[op]
}

// Image returns a copy of the AMI id in region, or nil.
func (f *AWS) Image(region, id string) *Image {
	f.mu.Lock()
	defer f.mu.Unlock()
	img := f.region(region).images[id]
	if img == nil {
		return nil
	}
	c := *img
	c.Tags, c.Params = maps.Clone(img.Tags), maps.Clone(img.Params)
	c.LaunchPermission = slices.Clone(img.LaunchPermission)
	return &c
}

// Snapshot returns a copy of the snapshot id in region, or nil.
func (f *AWS) Snapshot(region, id string) *Snapshot {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.region(region).snapshots[id]
	if s == nil {
		return nil
	}
	c := *s
	c.Tags, c.Blocks, c.digests = maps.Clone(s.Tags), maps.Clone(s.Blocks), nil
	c.VolumePermission = slices.Clone(s.VolumePermission)
	return &c
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
