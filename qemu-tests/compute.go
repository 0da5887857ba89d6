package qemutests

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"

	compute "google.golang.org/api/compute/v1"
)

// fakeCompute answers the Compute Engine v1 API for one zone's disks and instances as
// Compute Engine does: a bearer token is required (401 otherwise); disks.get,
// instances.get, instances.attachDisk (a zone operation, RUNNING until attach — the
// hotplug of the disk into the instance — returns, then DONE) and zoneOperations.wait/get.
type fakeCompute struct {
	project, zone, token string
	disks                map[string]*gceDisk
	instances            []string
	attach               func(disk *gceDisk, device string) error

	mu      sync.Mutex
	ops     map[string]*compute.Operation
	refused []string
	calls   []string
}

type gceDisk struct {
	name    string
	sizeGB  int64
	users   []string // instance names
	devices map[string]string
}

func (f *fakeCompute) zoneURL() string {
	return "https://www.googleapis.com/compute/v1/projects/" + f.project + "/zones/" + f.zone
}

func (f *fakeCompute) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r.Header.Get("Authorization") != "Bearer "+f.token {
		f.refused = append(f.refused, r.Method+" "+r.URL.Path)
		gceFail(w, http.StatusUnauthorized, "Request is missing required authentication credential. Expected OAuth 2 access token.", "required")
		return
	}
	rest, ok := strings.CutPrefix(r.URL.Path, "/compute/v1/projects/"+f.project+"/zones/"+f.zone+"/")
	parts := strings.Split(rest, "/")
	f.calls = append(f.calls, r.Method+" "+rest)
	switch {
	case !ok:
		gceFail(w, http.StatusNotFound, "The resource '"+r.URL.Path+"' was not found", "notFound")
	case r.Method == http.MethodGet && len(parts) == 2 && parts[0] == "disks":
		f.getDisk(w, parts[1])
	case r.Method == http.MethodGet && len(parts) == 2 && parts[0] == "instances":
		f.getInstance(w, parts[1])
	case r.Method == http.MethodPost && len(parts) == 3 && parts[0] == "instances" && parts[2] == "attachDisk":
		f.attachDisk(w, r, parts[1])
	case len(parts) >= 2 && parts[0] == "operations" && f.ops[parts[1]] != nil:
		gceJSON(w, f.ops[parts[1]]) // get and wait: the fake's operations end on their own
	default:
		gceFail(w, http.StatusNotFound, "The resource '"+r.URL.Path+"' was not found", "notFound")
	}
}

func (f *fakeCompute) getDisk(w http.ResponseWriter, name string) {
	d, ok := f.disks[name]
	if !ok {
		gceFail(w, http.StatusNotFound, fmt.Sprintf("The resource 'projects/%s/zones/%s/disks/%s' was not found", f.project, f.zone, name), "notFound")
		return
	}
	var users []string
	for _, u := range d.users {
		users = append(users, f.zoneURL()+"/instances/"+u)
	}
	gceJSON(w, compute.Disk{Kind: "compute#disk", Name: d.name, SizeGb: d.sizeGB, Status: "READY", Zone: f.zoneURL(),
		SelfLink: f.zoneURL() + "/disks/" + d.name, Type: f.zoneURL() + "/diskTypes/pd-balanced", Users: users})
}

func (f *fakeCompute) getInstance(w http.ResponseWriter, name string) {
	inst := compute.Instance{Kind: "compute#instance", Name: name, Status: "RUNNING", Zone: f.zoneURL(), SelfLink: f.zoneURL() + "/instances/" + name}
	for _, d := range f.disks {
		if dev, ok := d.devices[name]; ok {
			inst.Disks = append(inst.Disks, &compute.AttachedDisk{Kind: "compute#attachedDisk", Source: f.zoneURL() + "/disks/" + d.name,
				DeviceName: dev, Mode: "READ_WRITE", Type: "PERSISTENT", Interface: "SCSI"})
		}
	}
	gceJSON(w, inst)
}

func (f *fakeCompute) attachDisk(w http.ResponseWriter, r *http.Request, instance string) {
	var ad compute.AttachedDisk
	if err := json.NewDecoder(r.Body).Decode(&ad); err != nil {
		gceFail(w, http.StatusBadRequest, "Invalid JSON payload received. "+err.Error(), "parseError")
		return
	}
	name := ad.Source[strings.LastIndex(ad.Source, "/")+1:]
	d, ok := f.disks[name]
	switch {
	case ad.Source == "" || !strings.Contains(ad.Source, "/projects/"+f.project+"/zones/"+f.zone+"/disks/"):
		gceFail(w, http.StatusBadRequest, "Invalid value for field 'resource.source': '"+ad.Source+"'.", "invalid")
		return
	case !ok:
		gceFail(w, http.StatusNotFound, "The resource 'projects/"+f.project+"/zones/"+f.zone+"/disks/"+name+"' was not found", "notFound")
		return
	case len(d.users) > 0:
		gceFail(w, http.StatusBadRequest, fmt.Sprintf("The disk resource '%s' is already being used by '%s'", name, d.users[0]), "resourceInUseByAnotherResource")
		return
	}
	device := ad.DeviceName
	if device == "" {
		device = name
	}
	d.users = []string{instance}
	if d.devices == nil {
		d.devices = map[string]string{}
	}
	d.devices[instance] = device
	op := &compute.Operation{Kind: "compute#operation", Name: fmt.Sprintf("operation-attach-%d", len(f.ops)+1), OperationType: "attachDisk",
		Status: "RUNNING", TargetLink: f.zoneURL() + "/instances/" + instance, Zone: f.zoneURL()}
	op.SelfLink = f.zoneURL() + "/operations/" + op.Name
	if f.ops == nil {
		f.ops = map[string]*compute.Operation{}
	}
	f.ops[op.Name] = op
	reply := *op
	go func() {
		err := f.attach(d, device)
		f.mu.Lock()
		defer f.mu.Unlock()
		op.Status, op.Progress = "DONE", 100
		if err != nil {
			op.Error = &compute.OperationError{Errors: []*compute.OperationErrorErrors{{Code: "INTERNAL_ERROR", Message: err.Error()}}}
		}
	}()
	gceJSON(w, &reply)
}

func gceJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json; charset=UTF-8")
	json.NewEncoder(w).Encode(v)
}

func gceFail(w http.ResponseWriter, code int, msg, reason string) {
	w.Header().Set("Content-Type", "application/json; charset=UTF-8")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"code": code, "message": msg,
		"errors": []map[string]string{{"message": msg, "domain": "global", "reason": reason}}}})
}
