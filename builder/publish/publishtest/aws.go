package publishtest

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"encoding/xml"
	"errors"
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
	"sync"
	"testing"

	"github.com/kilnproject/kiln/internal/cloudfake"
)

const (
	// AWSAccessKeyID and AWSSecretAccessKey are the only credentials AWS accepts, alone or
	// with AWSSessionToken (temporary credentials); any other session token is refused.
	AWSAccessKeyID     = "AKIDKILNTEST"
	AWSSecretAccessKey = "kiln-test-secret"
	AWSSessionToken    = "kiln-test-session-token"
	// AWSAccount is the account that owns what AWS keeps.
	AWSAccount = "111122223333"
	// EBSBlockSize is the size of an EBS snapshot block.
	EBSBlockSize = 512 << 10
)

// AWS answers EBS direct (REST-JSON), EC2 and STS (Query, XML) over TLS as AWS does, for the
// calls kiln publish aws makes, in every region: the region and the service of a request are
// those of its SigV4 credential scope, whose signature it checks (a request signed with other
// credentials is refused with the service's error). It keeps snapshots and images, checks what
// EBS and EC2 check, and fails calls as its faults say.
type AWS struct {
	t       testing.TB
	srv     *httptest.Server
	mu      sync.Mutex
	regions map[string]*regionState
	next    int
	calls   map[string]int // by operation, including the failed ones
	faults  []*Fault
	pending int // Describe answers a completing snapshot or a new image stays pending
	// anyOwner makes Describe calls ignore Owner/OwnerId, as an endpoint that does not honour
	// Owner=self would: resources of other accounts are listed too.
	anyOwner bool
	tokens   map[string]string // CopyImage client token -> the image it made
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
	Owner                  string           // the owning account; "" is AWSAccount
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
	Owner                       string     // the owning account; "" is AWSAccount
	// Attrs are what DescribeImages says of it: BootMode, ImdsSupport, Architecture (those of
	// the RegisterImage request, or of the image copied).
	Attrs map[string]string
	looks int
}

func owner(o string) string {
	if o == "" {
		return AWSAccount
	}
	return o
}

// A Fault makes the calls of Op fail: after After calls have gone through, Times times (-1:
// always), with Status and the error Code, Message and (EBS) Reason, by cutting the
// connection before the call is made when Cut, or by making the call and then cutting the
// connection, the answer lost, when Lost. With Plant, the call is not failed: another
// principal of the account stores Plant in the call's region just before it is made (a race
// between kiln's lookup and its call).
type Fault struct {
	Op                    string
	After, Times          int
	Status                int
	Code, Message, Reason string
	Cut, Lost             bool
	Plant                 *Image
}

// NewAWS starts an AWS fake on https, stopped when the test ends. A new snapshot or image is
// pending for one Describe answer before it completes.
func NewAWS(t testing.TB) *AWS { return startAWS(t, true) }

// NewPlainAWS starts an AWS fake that speaks plain http, as an emulator may.
func NewPlainAWS(t testing.TB) *AWS { return startAWS(t, false) }

func startAWS(t testing.TB, tls bool) *AWS {
	f := &AWS{t: t, regions: map[string]*regionState{}, calls: map[string]int{}, pending: 1, tokens: map[string]string{}}
	f.srv = httptest.NewUnstartedServer(f)
	f.srv.Config.ErrorLog = log.New(io.Discard, "", 0) // connections the faults cut
	if tls {
		f.srv.StartTLS()
	} else {
		f.srv.Start()
	}
	t.Cleanup(f.srv.Close)
	return f
}

// URL is the endpoint of EBS, EC2 and STS, https://127.0.0.1:PORT (http:// for NewPlainAWS).
func (f *AWS) URL() string { return f.srv.URL }

// AnyOwner makes DescribeImages and DescribeSnapshots list the resources of every account
// whatever Owner they are asked for, as an endpoint that does not honour Owner=self.
func (f *AWS) AnyOwner() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.anyOwner = true
}

// PutImage stores img in region, as another principal (of this account, or of img.Owner's)
// would have registered it, and returns its id. Its state is available unless img says.
func (f *AWS) PutImage(region string, img Image) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.putImage(f.region(region), img)
}

func (f *AWS) putImage(reg *regionState, img Image) string {
	img.ID = f.newID("ami")
	if img.State == "" {
		img.State = "available"
	}
	if img.Attrs == nil {
		img.Attrs = map[string]string{"BootMode": "uefi", "ImdsSupport": "v2.0", "Architecture": "x86_64"}
	}
	reg.images[img.ID] = &img
	return img.ID
}

// Client is an HTTP client that trusts the fake's certificate.
func (f *AWS) Client() *http.Client { return f.srv.Client() }

// CAFile writes the fake's certificate as PEM into a file of the test's and returns its path,
// for AWS_CA_BUNDLE.
func (f *AWS) CAFile(t testing.TB) string {
	t.Helper()
	if f.srv.Certificate() == nil {
		t.Fatal("publishtest: CAFile of an AWS fake that speaks plain http")
	}
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

func (f *AWS) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return
	}
	region, service, err := verifySigV4(r, body)
	if err != nil {
		f.refuse(w, r, service, err)
		return
	}
	var op string
	var form url.Values
	if service == "ebs" {
		op = ebsOp(r)
	} else {
		form, _ = url.ParseQuery(string(body))
		op = form.Get("Action")
		if want := queryVersions[service]; r.Method != http.MethodPost || form.Get("Version") != want {
			f.t.Errorf("%s %s %s %s, Version %q: not a Query API call", service, op, r.Method, r.URL.Path, form.Get("Version"))
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls[op]++
	reg := f.region(region)
	answered, lose := f.fail(w, reg, service, op)
	if answered {
		return
	}
	out := w
	if lose {
		out = httptest.NewRecorder()
	}
	switch service {
	case "ec2":
		f.ec2(out, reg, region, op, form)
	case "sts":
		f.sts(out, op)
	default:
		f.ebs(out, reg, op, r, body)
	}
	if lose {
		cut(f.t, w)
	}
}

// queryVersions are the API versions of the Query services.
var queryVersions = map[string]string{"ec2": "2016-11-15", "sts": "2011-06-15"}

// refuse answers a request AWS cannot authenticate with the service's error. A request signed
// with the test's access key but not verifiable is a fault of the client's: the test fails.
func (f *AWS) refuse(w http.ResponseWriter, r *http.Request, service string, err error) {
	var bad *cloudfake.CredentialsError
	if !errors.As(err, &bad) {
		f.t.Errorf("%s %s not signed as AWS would accept: %v", r.Method, r.URL.Path, err)
	}
	switch service {
	case "ec2":
		ec2Error(w, http.StatusUnauthorized, "AuthFailure", "AWS was not able to validate the provided access credentials")
	case "sts":
		stsError(w, http.StatusForbidden, "InvalidClientTokenId", "The security token included in the request is invalid.")
	default:
		ebsError(w, http.StatusForbidden, "UnrecognizedClientException", "The security token included in the request is invalid.", "")
	}
}

// sts answers an STS call: GetCallerIdentity, the only one kiln makes.
func (f *AWS) sts(w http.ResponseWriter, op string) {
	if op != "GetCallerIdentity" {
		f.t.Errorf("unexpected STS action %q", op)
		stsError(w, http.StatusBadRequest, "InvalidAction", "Could not find operation "+op)
		return
	}
	w.Header().Set("Content-Type", "text/xml")
	fmt.Fprintf(w, `<GetCallerIdentityResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/"><GetCallerIdentityResult><Arn>arn:aws:iam::%s:user/kiln-ci</Arn><UserId>AIDAKILNTEST</UserId><Account>%s</Account></GetCallerIdentityResult><ResponseMetadata><RequestId>req-sts</RequestId></ResponseMetadata></GetCallerIdentityResponse>`, AWSAccount, AWSAccount)
}

func stsError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "text/xml")
	w.WriteHeader(status)
	fmt.Fprintf(w, `<ErrorResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/"><Error><Type>Sender</Type><Code>%s</Code><Message>%s</Message></Error><RequestId>req-err</RequestId></ErrorResponse>`, code, xmlEscape(msg))
}

// cut closes the connection of w without an answer.
func cut(t testing.TB, w http.ResponseWriter) {
	conn, _, err := w.(http.Hijacker).Hijack()
	if err != nil {
		t.Errorf("hijack: %v", err)
		return
	}
	conn.Close()
}

// fail answers the call with a fault's error, if one applies, and says whether it did, or
// whether the call is to be made and its answer lost; a planting fault stores its image in
// reg first.
func (f *AWS) fail(w http.ResponseWriter, reg *regionState, service, op string) (answered, lose bool) {
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
		switch {
		case ft.Plant != nil:
			f.putImage(reg, *ft.Plant)
			return false, false
		case ft.Lost:
			return false, true
		case ft.Cut:
			cut(f.t, w)
		case service == "ec2":
			ec2Error(w, ft.Status, ft.Code, ft.Message)
		case service == "sts":
			stsError(w, ft.Status, ft.Code, ft.Message)
		default:
			ebsError(w, ft.Status, ft.Code, ft.Message, ft.Reason)
		}
		return true, false
	}
	return false, false
}

// verifySigV4 checks r's signature with the test credentials (cloudfake.CheckSigV4) and
// returns its scope's region and service (the service also when it fails, if the scope
// names it).
func verifySigV4(r *http.Request, body []byte) (region, service string, err error) {
	creds := cloudfake.AWSCredentials{AccessKeyID: AWSAccessKeyID, SecretAccessKey: AWSSecretAccessKey}
	if r.Header.Get("X-Amz-Security-Token") == AWSSessionToken {
		creds.SessionToken = AWSSessionToken
	}
	scope, err := cloudfake.CheckSigV4(r, body, creds)
	return scope.Region, scope.Service, err
}

var (
	blockPath    = regexp.MustCompile(`^/snapshots/([^/]+)/blocks/(\d+)$`)
	blocksPath   = regexp.MustCompile(`^/snapshots/([^/]+)/blocks$`)
	completePath = regexp.MustCompile(`^/snapshots/completion/([^/]+)$`)
)

// ebsOp names the EBS direct API call r makes.
func ebsOp(r *http.Request) string {
	switch {
	case r.Method == http.MethodPost && r.URL.Path == "/snapshots":
		return "StartSnapshot"
	case r.Method == http.MethodPut && blockPath.MatchString(r.URL.Path):
		return "PutSnapshotBlock"
	case r.Method == http.MethodGet && blockPath.MatchString(r.URL.Path):
		return "GetSnapshotBlock"
	case r.Method == http.MethodGet && blocksPath.MatchString(r.URL.Path):
		return "ListSnapshotBlocks"
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

// AllCalls is how many calls AWS received, of every operation.
func (f *AWS) AllCalls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, c := range f.calls {
		n += c
	}
	return n
}

// PutSnapshot stores s in region as a completed snapshot, as another principal (of this
// account, or of s.Owner's) would have made it, and returns its id.
func (f *AWS) PutSnapshot(region string, s Snapshot) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	s.ID, s.State = f.newID("snap"), "completed"
	s.digests = map[int32][]byte{}
	for i, b := range s.Blocks {
		sum := sha256.Sum256(b)
		s.digests[i] = sum[:]
	}
	f.region(region).snapshots[s.ID] = &s
	return s.ID
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
	c.Tags, c.Params, c.Attrs = maps.Clone(img.Tags), maps.Clone(img.Params), maps.Clone(img.Attrs)
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
