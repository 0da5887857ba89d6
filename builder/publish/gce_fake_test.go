package publish

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
	"strings"
	"sync"
	"testing"

	"github.com/fsouza/fake-gcs-server/fakestorage"
	compute "google.golang.org/api/compute/v1"
)

// testToken is the bearer token the tests' clients send and the fakes require.
const testToken = "kiln-test-token"

// requireBearer answers 401 as Google APIs do when the request carries no test token.
func requireBearer(w http.ResponseWriter, r *http.Request) bool {
	if r.Header.Get("Authorization") == "Bearer "+testToken {
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

// gcsFault is what gcsFront does to one upload request.
type gcsFault string

const (
	faultNone    gcsFault = ""
	fault503     gcsFault = "503"     // answer 503 without passing the chunk on
	faultCut     gcsFault = "cut"     // read part of the chunk, then drop the connection
	faultDrop    gcsFault = "drop"    // read the chunk, then drop the connection unanswered
	faultCorrupt gcsFault = "corrupt" // flip one byte of the data on its way
)

// gcsFront stands before the Cloud Storage emulator (fake-gcs-server): it requires the bearer
// token, counts uploads and their chunks, records the checksums declared when an upload
// starts, and injects one fault into upload request number faultAt (1-based).
type gcsFront struct {
	gcs *fakestorage.Server
	srv *httptest.Server

	mu       sync.Mutex
	starts   int // uploads started (resumable sessions and single-request uploads)
	chunks   int // requests carrying data of a resumable upload
	declared []map[string]string
	fault    gcsFault
	faultAt  int
	faulted  bool
	// forbid answers every upload with the 403 Cloud Storage gives a caller without
	// storage.objects.create.
	forbid bool
}

func newGCSFront(t testing.TB, bucket string) *gcsFront {
	gcs, err := fakestorage.NewServerWithOptions(fakestorage.Options{NoListener: true})
	if err != nil {
		t.Fatal(err)
	}
	gcs.CreateBucketWithOpts(fakestorage.CreateBucketOpts{Name: bucket})
	f := &gcsFront{gcs: gcs}
	f.srv = httptest.NewServer(f)
	t.Cleanup(func() { f.srv.Close(); gcs.Stop() })
	return f
}

func (f *gcsFront) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !requireBearer(w, r) {
		return
	}
	if strings.HasPrefix(r.URL.Path, "/upload/") && !f.intercept(w, r) {
		return
	}
	f.gcs.HTTPHandler().ServeHTTP(w, r)
}

// intercept counts an upload request and applies the fault; false when it answered itself.
func (f *gcsFront) intercept(w http.ResponseWriter, r *http.Request) bool {
	if f.forbid {
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
	fault := faultNone
	if n != 0 && n == f.faultAt && !f.faulted {
		fault, f.faulted = f.fault, true
	}
	f.mu.Unlock()
	switch fault {
	case fault503:
		googleError(w, http.StatusServiceUnavailable, "backendError", "Backend Error")
		return false
	case faultCut, faultDrop:
		if fault == faultCut {
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
	if fault == faultCorrupt {
		body[len(body)/2] ^= 0xff
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	return true
}

// objects lists the bucket's object names.
func (f *gcsFront) objects(t testing.TB, bucket string) []string {
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

// computeFake answers the Compute Engine v1 calls kiln publish gce makes, for one project,
// checking images.insert the way GCE does: the raw disk must be an object in the emulator,
// and kiln's image must say UEFI, virtio-scsi multiqueue, gVNIC, x86_64, and carry its labels.
type computeFake struct {
	t       testing.TB
	project string
	gcs     *fakestorage.Server
	srv     *httptest.Server

	mu      sync.Mutex
	images  map[string]*compute.Image
	sources map[string][]byte // image name -> the object's bytes when it was inserted
	ops     map[string]*compute.Operation
	calls   []string // "METHOD path-after-project"
	// insertStatus answers images.insert with this HTTP error (403) when set; failOp makes the
	// insert's operation end with an error, leaving the image FAILED.
	insertStatus int
	failOp       bool
}

func newComputeFake(t testing.TB, project string, gcs *fakestorage.Server) *computeFake {
	f := &computeFake{t: t, project: project, gcs: gcs, images: map[string]*compute.Image{}, sources: map[string][]byte{}, ops: map[string]*compute.Operation{}}
	f.srv = httptest.NewServer(f)
	t.Cleanup(f.srv.Close)
	return f
}

var computePath = regexp.MustCompile(`^/compute/v1/projects/([^/]+)/global/(images|operations)(?:/([^/]+))?(/wait)?$`)

func (f *computeFake) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !requireBearer(w, r) {
		return
	}
	m := computePath.FindStringSubmatch(r.URL.Path)
	if m == nil || m[1] != f.project {
		googleError(w, http.StatusNotFound, "notFound", "The resource '"+r.URL.Path+"' was not found")
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, r.Method+" "+m[2]+"/"+m[3]+m[4])
	switch kind, name := m[2], m[3]; {
	case kind == "images" && name == "" && r.Method == http.MethodPost:
		f.insert(w, r)
	case kind == "images" && name == "" && r.Method == http.MethodGet:
		f.list(w, r)
	case kind == "images" && r.Method == http.MethodGet:
		if im := f.images[name]; im != nil {
			writeJSON(w, im)
			return
		}
		googleError(w, http.StatusNotFound, "notFound", fmt.Sprintf("The resource 'projects/%s/global/images/%s' was not found", f.project, name))
	case kind == "images" && r.Method == http.MethodDelete:
		if f.images[name] == nil {
			googleError(w, http.StatusNotFound, "notFound", fmt.Sprintf("The resource 'projects/%s/global/images/%s' was not found", f.project, name))
			return
		}
		delete(f.images, name)
		writeJSON(w, f.newOp("delete", name, "DONE"))
	case kind == "operations" && name != "":
		f.finish(w, name)
	default:
		googleError(w, http.StatusBadRequest, "badRequest", "unexpected "+r.Method+" "+r.URL.Path)
	}
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json; charset=UTF-8")
	json.NewEncoder(w).Encode(v)
}

func (f *computeFake) newOp(kind, image, status string) *compute.Operation {
	op := &compute.Operation{
		Kind: "compute#operation", Name: fmt.Sprintf("operation-%d-%s", len(f.ops)+1, kind), OperationType: kind, Status: status,
		TargetLink: fmt.Sprintf("%s/compute/v1/projects/%s/global/images/%s", f.srv.URL, f.project, image),
	}
	f.ops[op.Name] = op
	return op
}

// insert checks the image as GCE would and starts creating it.
func (f *computeFake) insert(w http.ResponseWriter, r *http.Request) {
	var im compute.Image
	if err := json.NewDecoder(r.Body).Decode(&im); err != nil {
		googleError(w, http.StatusBadRequest, "parseError", "Parse Error")
		return
	}
	if f.insertStatus == http.StatusForbidden {
		googleError(w, http.StatusForbidden, "forbidden", fmt.Sprintf("Required 'compute.images.create' permission for 'projects/%s/global/images/%s'", f.project, im.Name))
		return
	}
	if f.images[im.Name] != nil {
		googleError(w, http.StatusConflict, "alreadyExists", fmt.Sprintf("The resource 'projects/%s/global/images/%s' already exists", f.project, im.Name))
		return
	}
	content, err := f.checkImage(&im)
	if err != nil {
		googleError(w, http.StatusBadRequest, "invalid", err.Error())
		return
	}
	im.Kind, im.Status = "compute#image", "PENDING"
	im.SelfLink = fmt.Sprintf("%s/compute/v1/projects/%s/global/images/%s", f.srv.URL, f.project, im.Name)
	f.images[im.Name], f.sources[im.Name] = &im, content
	writeJSON(w, f.newOp("insert", im.Name, "RUNNING"))
}

// checkImage returns the bytes of the object the image is made from, or why GCE would refuse it.
func (f *computeFake) checkImage(im *compute.Image) ([]byte, error) {
	const prefix = "https://storage.googleapis.com/"
	if im.RawDisk == nil || !strings.HasPrefix(im.RawDisk.Source, prefix) || im.RawDisk.ContainerType != "TAR" {
		return nil, fmt.Errorf("Invalid value for field 'resource.rawDisk': %+v", im.RawDisk)
	}
	bucket, object, _ := strings.Cut(strings.TrimPrefix(im.RawDisk.Source, prefix), "/")
	object, err := url.PathUnescape(object)
	if err != nil {
		return nil, err
	}
	obj, err := f.gcs.GetObject(bucket, object)
	if err != nil {
		return nil, fmt.Errorf("The resource '%s' of type 'rawDisk.source' was not found: %v", im.RawDisk.Source, err)
	}
	var features []string
	for _, g := range im.GuestOsFeatures {
		features = append(features, g.Type)
	}
	for _, want := range []string{"UEFI_COMPATIBLE", "VIRTIO_SCSI_MULTIQUEUE", "GVNIC"} {
		if !slices.Contains(features, want) {
			return nil, fmt.Errorf("guestOsFeatures %v lack %s", features, want)
		}
	}
	if im.Architecture != "X86_64" {
		return nil, fmt.Errorf("Invalid value for field 'resource.architecture': %q", im.Architecture)
	}
	for k, v := range im.Labels {
		if checkGCELabelPart(k, true) != nil || checkGCELabelPart(v, false) != nil {
			return nil, fmt.Errorf("Invalid value for field 'resource.labels': %s=%s", k, v)
		}
	}
	return obj.Content, nil
}

// list answers images.list; the only filter it knows is labels.KEY=VALUE.
func (f *computeFake) list(w http.ResponseWriter, r *http.Request) {
	filter := r.URL.Query().Get("filter")
	k, v, ok := strings.Cut(strings.TrimPrefix(filter, "labels."), "=")
	if filter != "" && (!ok || !strings.HasPrefix(filter, "labels.")) {
		googleError(w, http.StatusBadRequest, "invalid", "Invalid list filter expression '"+filter+"'.")
		return
	}
	l := &compute.ImageList{Kind: "compute#imageList"}
	for _, im := range f.images {
		if filter == "" || im.Labels[k] == v {
			l.Items = append(l.Items, im)
		}
	}
	writeJSON(w, l)
}

// finish answers globalOperations.get and .wait: the operation is done, and an insert's image
// READY, or FAILED with the operation's error when failOp.
func (f *computeFake) finish(w http.ResponseWriter, name string) {
	op := f.ops[name]
	if op == nil {
		googleError(w, http.StatusNotFound, "notFound", fmt.Sprintf("The resource 'projects/%s/global/operations/%s' was not found", f.project, name))
		return
	}
	if op.Status != "DONE" && op.OperationType == "insert" {
		im := f.images[op.TargetLink[strings.LastIndex(op.TargetLink, "/")+1:]]
		im.Status = "READY"
		if f.failOp {
			im.Status = "FAILED"
			op.HttpErrorStatusCode, op.HttpErrorMessage = 400, "BAD REQUEST"
			op.Error = &compute.OperationError{Errors: []*compute.OperationErrorErrors{{Code: "IMAGE_IMPORT_ERROR", Message: "Image import failed: the disk.raw in the archive is not a bootable disk"}}}
		}
	}
	op.Status = "DONE"
	writeJSON(w, op)
}

// count counts the calls whose "METHOD path" starts with prefix.
func (f *computeFake) count(prefix string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, c := range f.calls {
		if strings.HasPrefix(c, prefix) {
			n++
		}
	}
	return n
}
