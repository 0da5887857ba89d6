package etcdvolume

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/oauth2"
	compute "google.golang.org/api/compute/v1"
	"google.golang.org/api/option"
)

const (
	gceProject = "kiln-prod"
	gceZone    = "europe-west4-a"
	gceMe      = "cp-b"
	gceToken   = "ya29.kiln-test-token"
	gceBase    = "https://www.googleapis.com/compute/v1/projects/" + gceProject + "/zones/" + gceZone
)

// fakeCompute answers the Compute Engine v1 REST API for disks.get, instances.get,
// instances.attachDisk and zoneOperations.wait, insisting on the bearer token.
type fakeCompute struct {
	t   *testing.T
	dev *fakeDev
	mu  sync.Mutex
	// disks maps a disk name to the instances using it (users).
	disks map[string][]string
	// deviceNames maps an instance's attached disk to its device name.
	deviceNames map[string]string
	// labels are the disks' labels, which disks.list filters on.
	labels map[string]map[string]string
	// race, when set, makes attachDisk lose to another instance: "request" refuses the
	// request, "operation" fails the operation.
	race     string
	requests []string // "METHOD path" of every request
	// unauthorized lists the requests refused for want of the bearer token.
	unauthorized []string
	attached     []compute.AttachedDisk
}

func (f *fakeCompute) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.requests = append(f.requests, r.Method+" "+r.URL.Path)
	if got := r.Header.Get("Authorization"); got != "Bearer "+gceToken {
		f.unauthorized = append(f.unauthorized, fmt.Sprintf("%s %s (Authorization %q)", r.Method, r.URL.Path, got))
		gceError(w, http.StatusUnauthorized, "Request is missing required authentication credential.", "required")
		return
	}
	prefix := "/compute/v1/projects/" + gceProject + "/zones/" + gceZone + "/"
	rest, ok := strings.CutPrefix(r.URL.Path, prefix)
	if !ok {
		f.t.Errorf("unexpected path %s", r.URL.Path)
		gceError(w, http.StatusNotFound, "not found", "notFound")
		return
	}
	parts := strings.Split(rest, "/")
	switch {
	case r.Method == http.MethodGet && len(parts) == 1 && parts[0] == "disks":
		f.listDisks(w, r.URL.Query().Get("filter"))
	case r.Method == http.MethodGet && len(parts) == 2 && parts[0] == "disks":
		f.getDisk(w, parts[1])
	case r.Method == http.MethodGet && len(parts) == 2 && parts[0] == "instances":
		f.getInstance(w, parts[1])
	case r.Method == http.MethodPost && len(parts) == 3 && parts[0] == "instances" && parts[2] == "attachDisk":
		f.attachDisk(w, r, parts[1])
	case r.Method == http.MethodPost && len(parts) == 3 && parts[0] == "operations" && parts[2] == "wait":
		f.waitOperation(w, parts[1])
	default:
		f.t.Errorf("unexpected request %s %s", r.Method, r.URL.Path)
		gceError(w, http.StatusNotFound, "not found", "notFound")
	}
}

// getDisk answers disks.get with the disk's users; f.mu is held.
func (f *fakeCompute) getDisk(w http.ResponseWriter, name string) {
	users, ok := f.disks[name]
	if !ok {
		gceError(w, http.StatusNotFound, fmt.Sprintf("The resource 'projects/%s/zones/%s/disks/%s' was not found", gceProject, gceZone, name), "notFound")
		return
	}
	var links []string
	for _, u := range users {
		links = append(links, gceBase+"/instances/"+u)
	}
	writeJSON(w, compute.Disk{Kind: "compute#disk", Name: name, SelfLink: gceBase + "/disks/" + name, Users: links, Zone: gceBase, Status: "READY"})
}

var labelExpr = regexp.MustCompile(`^\(labels\.([a-z][a-z0-9_-]*)(?: = "([a-z0-9_-]*)"|:\*)\)$`)

// listDisks answers disks.list with the disks whose labels match the filter, a list of
// (labels.KEY = "VALUE") and (labels.KEY:*) expressions as the Compute API takes them;
// f.mu is held.
func (f *fakeCompute) listDisks(w http.ResponseWriter, filter string) {
	want := map[string]*string{}
	for _, e := range strings.Fields(strings.ReplaceAll(filter, " = ", "=")) {
		m := labelExpr.FindStringSubmatch(strings.Replace(e, "=", " = ", 1))
		if m == nil {
			gceError(w, http.StatusBadRequest, "Invalid value for field 'filter': '"+filter+"'. Invalid list filter expression.", "invalid")
			return
		}
		if strings.HasSuffix(e, ":*)") {
			want[m[1]] = nil
		} else {
			want[m[1]] = &m[2]
		}
	}
	list := compute.DiskList{Kind: "compute#diskList"}
	for _, name := range slices.Sorted(maps.Keys(f.disks)) {
		ok := true
		for k, v := range want {
			got, has := f.labels[name][k]
			ok = ok && has && (v == nil || *v == got)
		}
		if ok {
			list.Items = append(list.Items, &compute.Disk{Kind: "compute#disk", Name: name, SelfLink: gceBase + "/disks/" + name, Labels: f.labels[name]})
		}
	}
	writeJSON(w, list)
}

// getInstance answers instances.get with the disks attached to the instance; f.mu is held.
func (f *fakeCompute) getInstance(w http.ResponseWriter, name string) {
	inst := compute.Instance{Kind: "compute#instance", Name: name, SelfLink: gceBase + "/instances/" + name}
	for disk, users := range f.disks {
		if slices.Contains(users, name) {
			inst.Disks = append(inst.Disks, &compute.AttachedDisk{
				Source:     "https://compute.googleapis.com/compute/v1/projects/" + gceProject + "/zones/" + gceZone + "/disks/" + disk,
				DeviceName: f.deviceNames[name+"/"+disk], Mode: "READ_WRITE", Type: "PERSISTENT",
			})
		}
	}
	writeJSON(w, inst)
}

// attachDisk answers instances.attachDisk: it refuses a disk in use, loses f.race, or
// attaches the disk and starts an operation; f.mu is held.
func (f *fakeCompute) attachDisk(w http.ResponseWriter, r *http.Request, instance string) {
	var ad compute.AttachedDisk
	if err := json.NewDecoder(r.Body).Decode(&ad); err != nil {
		f.t.Errorf("attachDisk body: %v", err)
	}
	f.attached = append(f.attached, ad)
	disk := ad.Source[strings.LastIndex(ad.Source, "/")+1:]
	if !strings.HasSuffix(ad.Source, "/projects/"+gceProject+"/zones/"+gceZone+"/disks/"+disk) || ad.Mode != "READ_WRITE" {
		f.t.Errorf("attachDisk of %+v", ad)
	}
	if f.race != "" {
		f.disks[disk] = []string{"cp-rival"}
	}
	if f.race == "request" || len(f.disks[disk]) > 0 && f.race == "" {
		gceError(w, http.StatusBadRequest, fmt.Sprintf("The disk resource 'projects/%s/zones/%s/disks/%s' is already being used by 'projects/%s/zones/%s/instances/%s'", gceProject, gceZone, disk, gceProject, gceZone, f.disks[disk][0]), "resourceInUseByAnotherResource")
		return
	}
	op := compute.Operation{Kind: "compute#operation", Name: "operation-attach-1", Status: "RUNNING", OperationType: "attachDisk", TargetLink: gceBase + "/instances/" + instance}
	if f.race == "operation" {
		op.Name = "operation-attach-race"
	} else {
		f.disks[disk] = []string{instance}
		f.deviceNames[instance+"/"+disk] = ad.DeviceName
	}
	writeJSON(w, op)
}

// waitOperation answers operations.wait: the attach operation is done and its disk's link
// appears, the raced one fails; f.mu is held.
func (f *fakeCompute) waitOperation(w http.ResponseWriter, name string) {
	op := compute.Operation{Kind: "compute#operation", Name: name, Status: "DONE", OperationType: "attachDisk"}
	switch name {
	case "operation-attach-1":
		for key, dn := range f.deviceNames {
			if strings.HasPrefix(key, gceMe+"/") {
				f.dev.link("google-"+dn, "sdb")
			}
		}
	case "operation-attach-race":
		op.Error = &compute.OperationError{Errors: []*compute.OperationErrorErrors{{
			Code: "RESOURCE_IN_USE_BY_ANOTHER_RESOURCE", Message: "The disk resource is already being used by 'cp-rival'",
		}}}
	default:
		gceError(w, http.StatusNotFound, "operation not found", "notFound")
		return
	}
	writeJSON(w, op)
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json; charset=UTF-8")
	json.NewEncoder(w).Encode(v)
}

func gceError(w http.ResponseWriter, status int, msg, reason string) {
	w.Header().Set("Content-Type", "application/json; charset=UTF-8")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{
		"code": status, "message": msg,
		"errors": []map[string]string{{"message": msg, "domain": "global", "reason": reason}},
	}})
}

func newCompute(t *testing.T, f *fakeCompute, token string) *compute.Service {
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	svc, err := compute.NewService(context.Background(),
		option.WithEndpoint(srv.URL+"/compute/v1/"),
		option.WithTokenSource(oauth2.StaticTokenSource(&oauth2.Token{AccessToken: token})))
	if err != nil {
		t.Fatal(err)
	}
	return svc
}

// gceCase is the disks a fake Compute API holds and what attaching the etcd disk must do.
type gceCase struct {
	name        string
	disks       map[string][]string
	deviceNames map[string]string
	race        string
	diskName    string
	labels      map[string]string            // the selector, when there is no diskName
	diskLabels  map[string]map[string]string // the disks' labels
	wantDisk    string                       // the disk a label selector selects
	wantAttach  []string                     // device names attachDisk was called with
	wantLink    string                       // the by-id link Find resolves
	wantErr     error
	wantMsg     string
}

var gceCases = []gceCase{
	{
		name:       "free disk is attached",
		disks:      map[string][]string{"prod-etcd-a": {"cp-a"}, "prod-etcd-b": nil},
		diskName:   "prod-etcd-b",
		wantAttach: []string{"prod-etcd-b"},
		wantLink:   "google-prod-etcd-b",
	},
	{
		name:        "disk attached to this instance under another device name",
		disks:       map[string][]string{"prod-etcd-b": {gceMe}},
		deviceNames: map[string]string{gceMe + "/prod-etcd-b": "persistent-disk-1"},
		diskName:    "prod-etcd-b",
		wantLink:    "google-persistent-disk-1",
	},
	{
		name:     "disk used by another instance",
		disks:    map[string][]string{"prod-etcd-b": {"cp-old"}},
		diskName: "prod-etcd-b",
		wantErr:  errAttachedElsewhere,
		wantMsg:  "instances/cp-old",
	},
	{
		name:       "another instance wins the race: request refused",
		disks:      map[string][]string{"prod-etcd-b": nil},
		race:       "request",
		diskName:   "prod-etcd-b",
		wantAttach: []string{"prod-etcd-b"},
		wantErr:    errAttachedElsewhere,
		wantMsg:    "already being used by",
	},
	{
		name:       "another instance wins the race: operation fails",
		disks:      map[string][]string{"prod-etcd-b": nil},
		race:       "operation",
		diskName:   "prod-etcd-b",
		wantAttach: []string{"prod-etcd-b"},
		wantErr:    errAttachedElsewhere,
		wantMsg:    "RESOURCE_IN_USE_BY_ANOTHER_RESOURCE",
	},
	{
		name:     "no such disk",
		disks:    map[string][]string{},
		diskName: "prod-etcd-b",
		wantErr:  errNotFound,
		wantMsg:  "gce disk prod-etcd-b: no matching volume in project kiln-prod, zone europe-west4-a",
	},
}

// etcdDiskLabels are kOps-like labels on the etcd disks of members a and b of cluster prod,
// and on a disk of another cluster.
var etcdDiskLabels = map[string]map[string]string{
	"prod-etcd-a":  {"k8s-io-etcd-main": "a", "kubernetes-io-cluster-prod": "owned"},
	"prod-etcd-b":  {"k8s-io-etcd-main": "b", "kubernetes-io-cluster-prod": "owned"},
	"stage-etcd-b": {"k8s-io-etcd-main": "b", "kubernetes-io-cluster-stage": "owned"},
}

var gceLabelCases = []gceCase{
	{
		name:       "disk selected by labels is attached",
		disks:      map[string][]string{"prod-etcd-a": {"cp-a"}, "prod-etcd-b": nil, "stage-etcd-b": nil},
		diskLabels: etcdDiskLabels,
		labels:     map[string]string{"k8s-io-etcd-main": "b", "kubernetes-io-cluster-prod": ""},
		wantDisk:   "prod-etcd-b",
		wantAttach: []string{"prod-etcd-b"},
	},
	{
		name:       "labels match two disks",
		disks:      map[string][]string{"prod-etcd-b": nil, "stage-etcd-b": nil},
		diskLabels: etcdDiskLabels,
		labels:     map[string]string{"k8s-io-etcd-main": "b"},
		wantMsg:    "gce disk with labels k8s-io-etcd-main=b: 2 disks match (prod-etcd-b, stage-etcd-b); expected one",
	},
	{
		name:       "labels match no disk",
		disks:      map[string][]string{"prod-etcd-a": nil},
		diskLabels: etcdDiskLabels,
		labels:     map[string]string{"k8s-io-etcd-main": "c", "kubernetes-io-cluster-prod": ""},
		wantErr:    errNotFound,
		wantMsg:    "gce disk with labels k8s-io-etcd-main=c,kubernetes-io-cluster-prod: no matching volume in project kiln-prod, zone europe-west4-a",
	},
}

func TestGCE(t *testing.T) {
	for _, tt := range gceLabelCases {
		t.Run(tt.name, func(t *testing.T) { checkGCE(t, tt) })
	}
	for _, tt := range gceCases {
		t.Run(tt.name, func(t *testing.T) { checkGCE(t, tt) })
	}
}

// checkGCE attaches tt.diskName against a fake Compute API and checks the outcome.
func checkGCE(t *testing.T, tt gceCase) {
	dev := newFakeDev(t)
	// The fake attaches disks by writing its own copy: the case table stays as written, so a
	// second run (go test -count=2) starts from the same disks.
	disks := map[string][]string{}
	for name, users := range tt.disks {
		disks[name] = slices.Clone(users)
	}
	f := &fakeCompute{t: t, dev: dev, disks: disks, deviceNames: map[string]string{}, race: tt.race, labels: tt.diskLabels}
	for k, v := range tt.deviceNames {
		f.deviceNames[k] = v
		dev.link("google-"+v, "sdb")
	}
	g := GCE{
		Service: newCompute(t, f, gceToken), Project: gceProject, Zone: gceZone, Instance: gceMe,
		DiskName: tt.diskName, Labels: tt.labels, DevDir: dev.byID, Timeout: 5 * time.Second, Poll: 10 * time.Millisecond, Log: quiet,
	}
	got, err := g.Find(context.Background())
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.unauthorized) > 0 {
		t.Errorf("requests without the bearer token: %q", f.unauthorized)
	}
	var attached []string
	for _, ad := range f.attached {
		attached = append(attached, ad.DeviceName)
	}
	if !slices.Equal(attached, tt.wantAttach) {
		t.Errorf("attachDisk device names = %q, want %q", attached, tt.wantAttach)
	}
	if tt.wantErr != nil || tt.wantMsg != "" {
		if err == nil || tt.wantErr != nil && !errors.Is(err, tt.wantErr) || !strings.Contains(err.Error(), tt.wantMsg) {
			t.Fatalf("Find = %q, %v; want %v with %q", got, err, tt.wantErr, tt.wantMsg)
		}
		return
	}
	if err != nil {
		t.Fatalf("Find: %v (requests %q)", err, f.requests)
	}
	if got != dev.devs+"/sdb" {
		t.Errorf("Find = %q, want %s", got, dev.devs+"/sdb")
	}
	if users := f.disks[tt.diskName+tt.wantDisk]; !slices.Equal(users, []string{gceMe}) {
		t.Errorf("disk users = %q", users)
	}
}

// TestGCEWithoutToken: the fake insists on the bearer token, so the tests above prove
// the client sends it.
func TestGCEWithoutToken(t *testing.T) {
	f := &fakeCompute{t: t, dev: newFakeDev(t), disks: map[string][]string{"d": nil}, deviceNames: map[string]string{}}
	srv := httptest.NewServer(f)
	defer srv.Close()
	svc, err := compute.NewService(context.Background(), option.WithEndpoint(srv.URL+"/compute/v1/"), option.WithoutAuthentication())
	if err != nil {
		t.Fatal(err)
	}
	_, err = GCE{Service: svc, Project: gceProject, Zone: gceZone, Instance: gceMe, DiskName: "d"}.Find(context.Background())
	if err == nil || !strings.Contains(err.Error(), "401") {
		t.Errorf("Find without a token = %v; want a 401", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.unauthorized) != 1 {
		t.Errorf("refused requests = %q", f.unauthorized)
	}
}

func TestGCEBadConfig(t *testing.T) {
	if _, err := (GCE{}).Find(context.Background()); err == nil || !strings.Contains(err.Error(), "no compute service") {
		t.Errorf("Find = %v", err)
	}
	if _, err := (GCE{Service: &compute.Service{}, Project: "p"}).Find(context.Background()); err == nil || !strings.Contains(err.Error(), "are required") {
		t.Errorf("Find = %v", err)
	}
}
