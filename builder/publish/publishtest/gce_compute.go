package publishtest

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"unicode"
	"unicode/utf8"

	compute "google.golang.org/api/compute/v1"
)

// Compute answers the Compute Engine v1 calls kiln publish gce makes, for one project,
// checking images.insert the way GCE does: the raw disk must be an object in the GCS emulator,
// and kiln's image must say UEFI, virtio-scsi multiqueue, gVNIC, x86_64, and carry valid labels.
type Compute struct {
	t       testing.TB
	project string
	token   string
	gcs     *GCS
	srv     *httptest.Server

	mu      sync.Mutex
	images  map[string]*compute.Image
	sources map[string][]byte // image name -> the object's bytes when it was inserted
	ops     map[string]*compute.Operation
	calls   []string // "METHOD path-after-project"
	forbid  bool     // answer images.insert with 403
	failOp  bool     // end the insert's operation with an error, leaving the image FAILED
	replace []byte   // what another client writes over the raw disk's object at images.insert
}

// NewCompute starts a Compute Engine fake of project whose images are made from the objects of
// gcs, stopped when the test ends. Requests must carry the bearer token; none when token is "".
func NewCompute(t testing.TB, token, project string, gcs *GCS) *Compute {
	f := &Compute{t: t, project: project, token: token, gcs: gcs, images: map[string]*compute.Image{}, sources: map[string][]byte{}, ops: map[string]*compute.Operation{}}
	f.srv = httptest.NewServer(f)
	t.Cleanup(f.srv.Close)
	return f
}

// URL is the fake's endpoint, http://127.0.0.1:PORT.
func (f *Compute) URL() string { return f.srv.URL }

// ForbidInsert answers images.insert with the 403 of a caller without compute.images.create.
func (f *Compute) ForbidInsert() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.forbid = true
}

// FailOperation makes the operation of images.insert end with an import error, the image
// FAILED.
func (f *Compute) FailOperation() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failOp = true
}

// ReplaceSource makes another client write content over the object of the next images.insert
// just before GCE reads it: the image is made from content, under a new generation.
func (f *Compute) ReplaceSource(content []byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.replace = content
}

// Image returns a copy of the image name, or nil.
func (f *Compute) Image(name string) *compute.Image {
	f.mu.Lock()
	defer f.mu.Unlock()
	im := f.images[name]
	if im == nil {
		return nil
	}
	c := *im
	c.Labels = maps.Clone(im.Labels)
	return &c
}

// Source is the content of the object the image name was made from, as it was at images.insert.
func (f *Compute) Source(name string) []byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.sources[name]
}

// PutImage adds an image, as made by another client; nil deletes every image.
func (f *Compute) PutImage(im *compute.Image) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if im == nil {
		clear(f.images)
		return
	}
	f.images[im.Name] = im
}

var computePath = regexp.MustCompile(`^/compute/v1/projects/([^/]+)/global/(images|operations)(?:/([^/]+))?(/wait)?$`)

func (f *Compute) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !authorized(w, r, f.token) {
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

func (f *Compute) newOp(kind, image, status string) *compute.Operation {
	op := &compute.Operation{
		Kind: "compute#operation", Name: fmt.Sprintf("operation-%d-%s", len(f.ops)+1, kind), OperationType: kind, Status: status,
		TargetLink: fmt.Sprintf("%s/compute/v1/projects/%s/global/images/%s", f.srv.URL, f.project, image),
	}
	f.ops[op.Name] = op
	return op
}

// insert checks the image as GCE would and starts creating it.
func (f *Compute) insert(w http.ResponseWriter, r *http.Request) {
	var im compute.Image
	if err := json.NewDecoder(r.Body).Decode(&im); err != nil {
		googleError(w, http.StatusBadRequest, "parseError", "Parse Error")
		return
	}
	if f.forbid {
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
func (f *Compute) checkImage(im *compute.Image) ([]byte, error) {
	const prefix = "https://storage.googleapis.com/"
	if im.RawDisk == nil || !strings.HasPrefix(im.RawDisk.Source, prefix) || im.RawDisk.ContainerType != "TAR" {
		return nil, fmt.Errorf("Invalid value for field 'resource.rawDisk': %+v", im.RawDisk)
	}
	bucket, object, _ := strings.Cut(strings.TrimPrefix(im.RawDisk.Source, prefix), "/")
	object, err := url.PathUnescape(object)
	if err != nil {
		return nil, err
	}
	if f.replace != nil {
		f.gcs.PutObject(bucket, object, f.replace)
		f.replace = nil
	}
	content, err := f.gcs.Object(bucket, object)
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
		if !labelOK(k, true) || !labelOK(v, false) {
			return nil, fmt.Errorf("Invalid value for field 'resource.labels': %s=%s", k, v)
		}
	}
	return content, nil
}

// list answers images.list; the only filter it knows is labels.KEY=VALUE.
func (f *Compute) list(w http.ResponseWriter, r *http.Request) {
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
func (f *Compute) finish(w http.ResponseWriter, name string) {
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

// Count counts the calls whose "METHOD path" starts with prefix.
func (f *Compute) Count(prefix string) int {
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

// labelOK says whether s is a valid label key (key) or value: up to 63 lowercase letters,
// digits, '_' and '-', a key starting with a letter.
func labelOK(s string, key bool) bool {
	n := utf8.RuneCountInString(s)
	if n > 63 || key && (n == 0 || !unicode.IsLower([]rune(s)[0])) {
		return false
	}
	for _, r := range s {
		if !unicode.IsLower(r) && !unicode.IsDigit(r) && r != '_' && r != '-' {
			return false
		}
	}
	return true
}
