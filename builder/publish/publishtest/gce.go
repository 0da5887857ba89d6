package publishtest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
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

	"github.com/fsouza/fake-gcs-server/fakestorage"
)

// GoogleToken is the bearer token GCS and Compute require when started with it.
const GoogleToken = "kiln-test-token"

// authorized answers 401, as Google APIs do, when the request does not carry the bearer token
// (token ""): none); it says whether the request may go on.
func authorized(w http.ResponseWriter, r *http.Request, token string) bool {
	got := r.Header.Get("Authorization")
	switch {
	case token == "" && got == "":
		return true
	case token == "":
		googleError(w, http.StatusUnauthorized, "UNAUTHENTICATED", "Credentials were sent to an endpoint that takes none.")
		return false
	case got == "Bearer "+token:
		return true
	}
	googleError(w, http.StatusUnauthorized, "UNAUTHENTICATED", "Request is missing required authentication credential.")
	return false
}

// googleError writes an error body the way Google's JSON APIs do.
func googleError(w http.ResponseWriter, code int, reason, msg string) {
	w.Header().Set("Content-Type", "application/json; charset=UTF-8")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{
		"code": code, "message": msg,
		"errors": []map[string]string{{"message": msg, "domain": "global", "reason": reason}},
	}})
}

// A GCSFault is what GCS does to one upload request.
type GCSFault string

const (
	GCS503     GCSFault = "503"     // answer 503 without passing the chunk on
	GCSCut     GCSFault = "cut"     // read part of the chunk, then drop the connection
	GCSDrop    GCSFault = "drop"    // read the chunk, then drop the connection unanswered
	GCSCorrupt GCSFault = "corrupt" // flip one byte of the data on its way
)

// GCS stands before the Cloud Storage emulator (fake-gcs-server): it requires the bearer
// token it was started with, counts uploads and their chunks, records the checksums declared
// when an upload starts, and injects one fault into the upload request its fault names.
type GCS struct {
	gcs   *fakestorage.Server
	srv   *httptest.Server
	token string

	mu       sync.Mutex
	starts   int // uploads started (resumable sessions and single-request uploads)
	chunks   int // requests carrying data of a resumable upload
	declared []map[string]string
	fault    GCSFault
	faultAt  int
	faulted  bool
	forbid   bool
	race     *raceObject  // stored by "another client" when the first chunk arrives
	requests int          // every request that carried the token
	deletes  []url.Values // the query of every object delete
}

type raceObject struct {
	bucket, name string
	content      []byte
}

// NewGCS starts the emulator with the buckets, stopped when the test ends. Requests must
// carry the bearer token; none when token is "", as a client given no credentials sends.
func NewGCS(t testing.TB, token string, buckets ...string) *GCS {
	gcs, err := fakestorage.NewServerWithOptions(fakestorage.Options{NoListener: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range buckets {
		gcs.CreateBucketWithOpts(fakestorage.CreateBucketOpts{Name: b})
	}
	f := &GCS{gcs: gcs, token: token}
	f.srv = httptest.NewServer(f)
	t.Cleanup(func() { f.srv.Close(); gcs.Stop() })
	return f
}

// URL is the emulator's endpoint, http://127.0.0.1:PORT.
func (f *GCS) URL() string { return f.srv.URL }

// Fail makes upload request number at (1-based: the single request, or the chunks of a
// resumable upload) fail as fault says, once.
func (f *GCS) Fail(fault GCSFault, at int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fault, f.faultAt = fault, at
}

// Forbid answers every upload with the 403 Cloud Storage gives a caller without
// storage.objects.create.
func (f *GCS) Forbid() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.forbid = true
}

// RaceObject makes another client store an object of that name and content while the next
// resumable upload is under way: when its first chunk arrives.
func (f *GCS) RaceObject(bucket, name string, content []byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.race = &raceObject{bucket, name, content}
}

// Uploads is how many uploads were started, how many requests carried the chunks of
// resumable ones, and whether the fault was injected.
func (f *GCS) Uploads() (starts, chunks int, faulted bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.starts, f.chunks, f.faulted
}

// Declared is the crc32c and md5Hash each resumable upload declared when it started.
func (f *GCS) Declared() []map[string]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.declared)
}

func (f *GCS) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !authorized(w, r, f.token) {
		return
	}
	f.mu.Lock()
	f.requests++
	f.mu.Unlock()
	if strings.HasPrefix(r.URL.Path, "/upload/") && !f.intercept(w, r) {
		return
	}
	if r.Method == http.MethodDelete && !f.deleteAllowed(w, r) {
		return
	}
	f.gcs.HTTPHandler().ServeHTTP(w, r)
}

// objectPath is the JSON API path of an object: /storage/v1/b/BUCKET/o/OBJECT.
var objectPath = regexp.MustCompile(`^/storage/v1/b/([^/]+)/o/(.+)$`)

// deleteAllowed records an object delete and checks its ifGenerationMatch as Cloud Storage
// does (the emulator does not): 412 unless the object's live generation is the one given. It
// says whether the request may go on.
func (f *GCS) deleteAllowed(w http.ResponseWriter, r *http.Request) bool {
	m := objectPath.FindStringSubmatch(r.URL.EscapedPath())
	if m == nil {
		return true
	}
	bucket, _ := url.PathUnescape(m[1])
	name, _ := url.PathUnescape(m[2])
	q := r.URL.Query()
	f.mu.Lock()
	f.deletes = append(f.deletes, q)
	f.mu.Unlock()
	want := q.Get("ifGenerationMatch")
	if want == "" {
		return true
	}
	obj, err := f.gcs.GetObject(bucket, name)
	if err != nil {
		googleError(w, http.StatusNotFound, "notFound", "No such object: "+bucket+"/"+name)
		return false
	}
	if strconv.FormatInt(obj.Generation, 10) != want {
		googleError(w, http.StatusPreconditionFailed, "conditionNotMet", "At least one of the pre-conditions you specified did not hold.")
		return false
	}
	return true
}

// Requests is how many requests carrying the right credentials GCS received.
func (f *GCS) Requests() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.requests
}

// Deletes is the query of every object delete GCS received (generation, ifGenerationMatch).
func (f *GCS) Deletes() []url.Values {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.deletes)
}

// Generation is the live generation of an object, 0 when there is none.
func (f *GCS) Generation(bucket, name string) int64 {
	obj, err := f.gcs.GetObject(bucket, name)
	if err != nil {
		return 0
	}
	return obj.Generation
}

// intercept counts an upload request and applies the fault; false when it answered itself.
func (f *GCS) intercept(w http.ResponseWriter, r *http.Request) bool {
	f.mu.Lock()
	forbid := f.forbid
	f.mu.Unlock()
	if forbid {
		googleError(w, http.StatusForbidden, "forbidden", "kiln-ci@kiln-test.iam.gserviceaccount.com does not have storage.objects.create access to the Google Cloud Storage object. Permission 'storage.objects.create' denied on resource (or it may not exist).")
		return false
	}
	q := r.URL.Query()
	f.mu.Lock()
	n := 0
	switch {
	case q.Get("upload_id") != "":
		f.chunks++
		n = f.chunks
	case q.Get("uploadType") == "resumable":
		f.starts++
	default: // a single-request upload
		f.starts++
		n = 1
	}
	fault := GCSFault("")
	if n != 0 && n == f.faultAt && !f.faulted {
		fault, f.faulted = f.fault, true
	}
	race := f.race
	if q.Get("upload_id") != "" {
		f.race = nil
	} else {
		race = nil
	}
	f.mu.Unlock()
	if race != nil {
		f.PutObject(race.bucket, race.name, race.content)
	}
	switch fault {
	case GCS503:
		googleError(w, http.StatusServiceUnavailable, "backendError", "Backend Error")
		return false
	case GCSCut, GCSDrop:
		if fault == GCSCut {
			io.CopyN(io.Discard, r.Body, r.ContentLength/2)
		} else {
			io.Copy(io.Discard, r.Body)
		}
		if conn, _, err := w.(http.Hijacker).Hijack(); err == nil {
			conn.Close()
		}
		return false
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return false
	}
	if n == 0 {
		var md map[string]any
		json.Unmarshal(body, &md)
		f.mu.Lock()
		f.declared = append(f.declared, map[string]string{"crc32c": fmt.Sprint(md["crc32c"]), "md5Hash": fmt.Sprint(md["md5Hash"])})
		f.mu.Unlock()
	}
	if fault == GCSCorrupt {
		body[len(body)/2] ^= 0xff
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	return true
}

// Objects lists the names of the bucket's objects.
func (f *GCS) Objects(t testing.TB, bucket string) []string {
	t.Helper()
	objs, _, err := f.gcs.ListObjects(bucket, "", "", false)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, o := range objs {
		names = append(names, o.Name)
	}
	return names
}

// Object returns the content of an object.
func (f *GCS) Object(bucket, name string) ([]byte, error) {
	obj, err := f.gcs.GetObject(bucket, name)
	if err != nil {
		return nil, err
	}
	return obj.Content, nil
}

// PutObject stores an object, as another client's upload would: a new generation.
func (f *GCS) PutObject(bucket, name string, content []byte) {
	f.gcs.CreateObject(f.newObject(bucket, name, content))
}

// newObject is an object of a generation after the live one's, as Cloud Storage gives.
func (f *GCS) newObject(bucket, name string, content []byte) fakestorage.Object {
	gen := time.Now().UnixMicro()
	if cur := f.Generation(bucket, name); cur >= gen {
		gen = cur + 1
	}
	return fakestorage.Object{ObjectAttrs: fakestorage.ObjectAttrs{BucketName: bucket, Name: name, Generation: gen}, Content: content}
}
