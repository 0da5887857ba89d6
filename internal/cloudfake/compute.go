package cloudfake

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	compute "google.golang.org/api/compute/v1"
)

// Compute is a fake of the Compute Engine v1 API for one zone's disks and instances, as
// Compute Engine answers it. A request must carry Token as its bearer token (else 401)
// and name a method of the fake (else 404): disks.get, disks.list (filtered on labels,
// "(labels.KEY = "VALUE")" and "(labels.KEY:*)" expressions; another filter is refused
// with 400), instances.get, instances.attachDisk, zoneOperations.get and
// zoneOperations.wait.
//
// instances.attachDisk checks what Compute Engine checks (a body naming a disk of the
// zone, in a mode and of a type the API knows; the instance and disk exist; the disk is
// free; the device name is free on the instance), attaches the disk and answers a zone
// operation RUNNING until Attach returns, then DONE; when Attach fails the operation
// fails and the disk is not attached. zoneOperations.wait returns once the operation is
// DONE, or after two minutes as the API does.
type Compute struct {
	// Token is the bearer token requests must carry.
	Token string
	// Project and Zone are the zone the fake serves.
	Project, Zone string
	// Instances are the names of the zone's instances.
	Instances []string
	// Disks are the zone's disks by name.
	Disks map[string]*GCEDisk
	// BeforeAttach, when set, runs in instances.attachDisk on the disk it names, before the
	// fake looks at the disk: the place for another instance to win the race for it.
	BeforeAttach func(name string, d *GCEDisk)
	// Attach, when set, plugs disk into its instance as device (a QEMU hotplug, or the
	// device link udev would make) while the attach operation runs. It runs in its own
	// goroutine, without the lock. A *GCEOperationError it returns fails the operation
	// with its code; another error with INTERNAL_ERROR.
	Attach func(disk, device string) error

	// Mutex guards the fake's state: a test holds it to read or change Disks while the
	// fake serves.
	sync.Mutex
	ops     map[string]*gceOperation
	calls   []ComputeCall
	refused []string
}

// GCEDisk is a persistent disk of the Compute fake.
type GCEDisk struct {
	// SizeGB is the disk's size; 0 answers 10.
	SizeGB int64
	Labels map[string]string
	// Users are the names of the instances the disk is attached to, Devices the device
	// name it has on each.
	Users   []string
	Devices map[string]string
}

// ComputeCall is a request the Compute fake took.
type ComputeCall struct {
	// Method and Path are the request's, Path below the zone ("disks/etcd",
	// "instances/cp-a/attachDisk").
	Method, Path string
	// AttachedDisk is instances.attachDisk's body.
	AttachedDisk *compute.AttachedDisk
}

// GCEOperationError is an error Compute.Attach returns to fail the attach operation with
// Code, as Compute Engine fails it: RESOURCE_IN_USE_BY_ANOTHER_RESOURCE when another
// instance took the disk first.
type GCEOperationError struct{ Code, Message string }

// Error implements error.
func (e *GCEOperationError) Error() string { return e.Code + ": " + e.Message }

// gceOperation is a zone operation of the fake and its end.
type gceOperation struct {
	op   *compute.Operation
	done chan struct{}
}

// gceWaitLimit is how long zoneOperations.wait waits at most.
const gceWaitLimit = 2 * time.Minute

// Calls returns the requests the fake took, in order.
func (f *Compute) Calls() []ComputeCall {
	f.Lock()
	defer f.Unlock()
	return slices.Clone(f.calls)
}

// Refused returns the requests the fake refused, each with the reason.
func (f *Compute) Refused() []string {
	f.Lock()
	defer f.Unlock()
	return slices.Clone(f.refused)
}

func (f *Compute) zoneURL() string {
	return "https://www.googleapis.com/compute/v1/projects/" + f.Project + "/zones/" + f.Zone
}

// ServeHTTP implements http.Handler.
func (f *Compute) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.Lock()
	wait := f.serve(w, r)
	f.Unlock()
	if wait == nil {
		return
	}
	select {
	case <-wait.done:
	case <-r.Context().Done():
		return
	case <-time.After(gceWaitLimit):
	}
	f.Lock()
	op := *wait.op
	f.Unlock()
	googleJSON(w, &op)
}

// serve answers r, or returns the operation to wait for before answering it; f is locked.
func (f *Compute) serve(w http.ResponseWriter, r *http.Request) *gceOperation {
	refuse := func(status int, msg, reason, why string) {
		f.refused = append(f.refused, refusal(r, why))
		googleError(w, status, msg, reason)
	}
	if got := r.Header.Get("Authorization"); got != "Bearer "+f.Token {
		refuse(http.StatusUnauthorized, "Request is missing required authentication credential. Expected OAuth 2 access token, login cookie or other valid authentication credential.",
			"required", bearerRefusal(got))
		return nil
	}
	rest, ok := strings.CutPrefix(r.URL.Path, "/compute/v1/projects/"+f.Project+"/zones/"+f.Zone+"/")
	parts := strings.Split(rest, "/")
	call := ComputeCall{Method: r.Method, Path: rest}
	switch {
	case !ok:
		refuse(http.StatusNotFound, "The resource '"+r.URL.Path+"' was not found", "notFound", "not in project "+f.Project+", zone "+f.Zone)
	case r.Method == http.MethodGet && len(parts) == 1 && parts[0] == "disks":
		filter, err := labelFilter(r.URL.Query().Get("filter"))
		if err != nil {
			refuse(http.StatusBadRequest, "Invalid value for field 'filter': '"+r.URL.Query().Get("filter")+"'. Invalid list filter expression.", "invalid", err.Error())
			return nil
		}
		f.calls = append(f.calls, call)
		f.listDisks(w, filter)
	case r.Method == http.MethodGet && len(parts) == 2 && parts[0] == "disks":
		f.calls = append(f.calls, call)
		f.getDisk(w, parts[1])
	case r.Method == http.MethodGet && len(parts) == 2 && parts[0] == "instances":
		f.calls = append(f.calls, call)
		f.getInstance(w, parts[1])
	case r.Method == http.MethodPost && len(parts) == 3 && parts[0] == "instances" && parts[2] == "attachDisk":
		var ad compute.AttachedDisk
		if err := json.NewDecoder(r.Body).Decode(&ad); err != nil {
			refuse(http.StatusBadRequest, "Invalid JSON payload received. "+err.Error(), "parseError", "attachDisk body: "+err.Error())
			return nil
		}
		if why, ok := f.checkAttachedDisk(&ad); !ok {
			refuse(http.StatusBadRequest, why, "invalid", why)
			return nil
		}
		call.AttachedDisk = &ad
		f.calls = append(f.calls, call)
		f.attachDisk(w, parts[1], &ad)
	case r.Method == http.MethodGet && len(parts) == 2 && parts[0] == "operations",
		r.Method == http.MethodPost && len(parts) == 3 && parts[0] == "operations" && parts[2] == "wait":
		f.calls = append(f.calls, call)
		op := f.ops[parts[1]]
		switch {
		case op == nil:
			googleError(w, http.StatusNotFound, "The resource '"+f.resource("operations", parts[1])+"' was not found", "notFound")
		case len(parts) == 3:
			return op
		default:
			googleJSON(w, op.op)
		}
	default:
		refuse(http.StatusNotFound, "The resource '"+r.URL.Path+"' was not found", "notFound", "not a method of the fake")
	}
	return nil
}

// resource is the relative name of the zone's resource of kind ("disks", "instances").
func (f *Compute) resource(kind, name string) string {
	return "projects/" + f.Project + "/zones/" + f.Zone + "/" + kind + "/" + name
}

var labelExpr = regexp.MustCompile(`^\(labels\.([a-z][a-z0-9_-]*)(?: = "([a-z0-9_-]*)"|:\*)\)$`)

// labelFilter reads a disks.list filter of label expressions into the values each label
// must have (nil: any value).
func labelFilter(filter string) (map[string]*string, error) {
	want := map[string]*string{}
	for _, e := range strings.Fields(strings.ReplaceAll(filter, " = ", "=")) {
		m := labelExpr.FindStringSubmatch(strings.Replace(e, "=", " = ", 1))
		if m == nil {
			return nil, fmt.Errorf("filter expression %q is not (labels.KEY = \"VALUE\") or (labels.KEY:*)", e)
		}
		if strings.HasSuffix(e, ":*)") {
			want[m[1]] = nil
		} else {
			want[m[1]] = &m[2]
		}
	}
	return want, nil
}

func (f *Compute) disk(name string, d *GCEDisk) *compute.Disk {
	var users []string
	for _, u := range d.Users {
		users = append(users, f.zoneURL()+"/instances/"+u)
	}
	size := d.SizeGB
	if size == 0 {
		size = 10
	}
	return &compute.Disk{Kind: "compute#disk", Name: name, SizeGb: size, Status: "READY", Zone: f.zoneURL(),
		SelfLink: f.zoneURL() + "/disks/" + name, Type: f.zoneURL() + "/diskTypes/pd-balanced", Users: users, Labels: d.Labels}
}

func (f *Compute) listDisks(w http.ResponseWriter, want map[string]*string) {
	list := compute.DiskList{Kind: "compute#diskList", SelfLink: f.zoneURL() + "/disks"}
	for _, name := range slices.Sorted(maps.Keys(f.Disks)) {
		d, ok := f.Disks[name], true
		for k, v := range want {
			got, has := d.Labels[k]
			ok = ok && has && (v == nil || *v == got)
		}
		if ok {
			list.Items = append(list.Items, f.disk(name, d))
		}
	}
	googleJSON(w, list)
}

func (f *Compute) getDisk(w http.ResponseWriter, name string) {
	d, ok := f.Disks[name]
	if !ok {
		googleError(w, http.StatusNotFound, "The resource '"+f.resource("disks", name)+"' was not found", "notFound")
		return
	}
	googleJSON(w, f.disk(name, d))
}

// getInstance answers instances.get with the disks attached to the instance. Their sources
// name compute.googleapis.com while disks' self links name www.googleapis.com: both hosts
// appear in the API's answers, and a client compares resources by their path.
func (f *Compute) getInstance(w http.ResponseWriter, name string) {
	if !slices.Contains(f.Instances, name) {
		googleError(w, http.StatusNotFound, "The resource '"+f.resource("instances", name)+"' was not found", "notFound")
		return
	}
	inst := compute.Instance{Kind: "compute#instance", Name: name, Status: "RUNNING", Zone: f.zoneURL(), SelfLink: f.zoneURL() + "/instances/" + name}
	for _, disk := range slices.Sorted(maps.Keys(f.Disks)) {
		if d := f.Disks[disk]; slices.Contains(d.Users, name) {
			inst.Disks = append(inst.Disks, &compute.AttachedDisk{Kind: "compute#attachedDisk",
				Source:     "https://compute.googleapis.com/compute/v1/" + f.resource("disks", disk),
				DeviceName: d.Devices[name], Mode: "READ_WRITE", Type: "PERSISTENT", Interface: "SCSI"})
		}
	}
	googleJSON(w, inst)
}

// checkAttachedDisk checks an attachDisk body as the API does: its source names a disk
// of the zone (a URL or a partial one), its mode and type are ones the API knows.
func (f *Compute) checkAttachedDisk(ad *compute.AttachedDisk) (string, bool) {
	i := strings.Index(ad.Source, f.resource("disks", ""))
	switch {
	case i < 0 || (i > 0 && ad.Source[i-1] != '/') || strings.Contains(ad.Source[i+len(f.resource("disks", "")):], "/") ||
		strings.HasSuffix(ad.Source, "/"):
		return "Invalid value for field 'resource.source': '" + ad.Source + "'. The URL is malformed.", false
	case ad.Mode != "" && ad.Mode != "READ_WRITE" && ad.Mode != "READ_ONLY":
		return "Invalid value for field 'resource.mode': '" + ad.Mode + "'.", false
	case ad.Type != "" && ad.Type != "PERSISTENT" && ad.Type != "SCRATCH":
		return "Invalid value for field 'resource.type': '" + ad.Type + "'.", false
	}
	return "", true
}

func (f *Compute) attachDisk(w http.ResponseWriter, instance string, ad *compute.AttachedDisk) {
	name := ad.Source[strings.LastIndex(ad.Source, "/")+1:]
	d, ok := f.Disks[name]
	if ok && f.BeforeAttach != nil {
		f.BeforeAttach(name, d)
	}
	device := ad.DeviceName
	if device == "" {
		device = name
	}
	switch {
	case !slices.Contains(f.Instances, instance):
		googleError(w, http.StatusNotFound, "The resource '"+f.resource("instances", instance)+"' was not found", "notFound")
		return
	case !ok:
		googleError(w, http.StatusNotFound, "The resource '"+f.resource("disks", name)+"' was not found", "notFound")
		return
	case len(d.Users) > 0:
		googleError(w, http.StatusBadRequest, fmt.Sprintf("The disk resource '%s' is already being used by '%s'",
			f.resource("disks", name), f.resource("instances", d.Users[0])), "resourceInUseByAnotherResource")
		return
	}
	for other, od := range f.Disks {
		if od.Devices[instance] == device && slices.Contains(od.Users, instance) {
			googleError(w, http.StatusBadRequest, fmt.Sprintf("Invalid value for field 'resource.deviceName': '%s'. Device name is already used by disk '%s'.",
				device, f.resource("disks", other)), "invalid")
			return
		}
	}
	d.Users = []string{instance}
	if d.Devices == nil {
		d.Devices = map[string]string{}
	}
	d.Devices[instance] = device
	if f.ops == nil {
		f.ops = map[string]*gceOperation{}
	}
	op := &gceOperation{done: make(chan struct{}), op: &compute.Operation{Kind: "compute#operation",
		Name: fmt.Sprintf("operation-attach-%d", len(f.ops)+1), OperationType: "attachDisk", Status: "RUNNING",
		TargetLink: f.zoneURL() + "/instances/" + instance, Zone: f.zoneURL()}}
	op.op.SelfLink = f.zoneURL() + "/operations/" + op.op.Name
	f.ops[op.op.Name] = op
	googleJSON(w, *op.op)
	attach := f.Attach
	if attach == nil {
		f.finish(op, d, instance, nil)
		return
	}
	go func() {
		err := attach(name, device)
		f.Lock()
		defer f.Unlock()
		f.finish(op, d, instance, err)
	}()
}

// finish ends attach operation op with err: DONE, and on an error failed with the disk
// not attached; f is locked.
func (f *Compute) finish(op *gceOperation, d *GCEDisk, instance string, err error) {
	op.op.Status, op.op.Progress = "DONE", 100
	if err != nil {
		fail := &compute.OperationErrorErrors{Code: "INTERNAL_ERROR", Message: err.Error()}
		if oe := (*GCEOperationError)(nil); errors.As(err, &oe) {
			fail.Code, fail.Message = oe.Code, oe.Message
		}
		op.op.Error = &compute.OperationError{Errors: []*compute.OperationErrorErrors{fail}}
		d.Users = slices.DeleteFunc(d.Users, func(u string) bool { return u == instance })
		delete(d.Devices, instance)
	}
	close(op.done)
}
