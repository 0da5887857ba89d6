package cloudfake

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"

	"golang.org/x/oauth2"
	compute "google.golang.org/api/compute/v1"
	"google.golang.org/api/googleapi"
	"google.golang.org/api/option"
)

const (
	gceProject = "kiln-test"
	gceZone    = "europe-west4-b"
	gceToken   = "ya29.kiln"
)

func newComputeFake() *Compute {
	return &Compute{Token: gceToken, Project: gceProject, Zone: gceZone, Instances: []string{"cp-a", "cp-b"}, Disks: map[string]*GCEDisk{
		"etcd-a": {SizeGB: 2, Labels: map[string]string{"k8s-io-etcd-main": "a"}},
		"etcd-b": {SizeGB: 2, Labels: map[string]string{"k8s-io-etcd-main": "b"}, Users: []string{"cp-b"}, Devices: map[string]string{"cp-b": "etcd-b"}},
	}}
}

// computeService is a client of srv with token as its bearer token ("" for none).
func computeService(t *testing.T, srv *httptest.Server, token string) *compute.Service {
	hc := srv.Client()
	if token != "" {
		hc = oauth2.NewClient(context.Background(), oauth2.StaticTokenSource(&oauth2.Token{AccessToken: token}))
	}
	svc, err := compute.NewService(context.Background(), option.WithEndpoint(srv.URL+"/compute/v1/"), option.WithHTTPClient(hc))
	if err != nil {
		t.Fatal(err)
	}
	return svc
}

// apiCode is the HTTP status and first reason of a Google API error, 0 and "" for none.
func apiCode(err error) (int, string) {
	var ae *googleapi.Error
	if !errors.As(err, &ae) {
		return 0, ""
	}
	if len(ae.Errors) == 0 {
		return ae.Code, ""
	}
	return ae.Code, ae.Errors[0].Reason
}

// TestCompute drives the Compute fake with Google's client: a disk selected by its labels
// is attached by an operation that ends when Attach returns, and what Compute Engine
// refuses is refused with its status and reason.
func TestCompute(t *testing.T) {
	f := newComputeFake()
	plugged := make(chan string, 1)
	f.Attach = func(disk, device string) error { plugged <- disk + " " + device; return nil }
	srv := httptest.NewServer(f)
	defer srv.Close()
	ctx := context.Background()
	svc := computeService(t, srv, gceToken)

	list, err := svc.Disks.List(gceProject, gceZone).Filter(`(labels.k8s-io-etcd-main = "a")`).Context(ctx).Do()
	if err != nil || len(list.Items) != 1 || list.Items[0].Name != "etcd-a" {
		t.Fatalf("Disks.List = %+v, %v", list, err)
	}
	op, err := svc.Instances.AttachDisk(gceProject, gceZone, "cp-a", &compute.AttachedDisk{Source: list.Items[0].SelfLink, Mode: "READ_WRITE"}).Context(ctx).Do()
	if err != nil || op.Status != "RUNNING" {
		t.Fatalf("AttachDisk = %+v, %v", op, err)
	}
	if got := <-plugged; got != "etcd-a etcd-a" {
		t.Errorf("Attach(%s)", got)
	}
	if op, err = svc.ZoneOperations.Wait(gceProject, gceZone, op.Name).Context(ctx).Do(); err != nil || op.Status != "DONE" || op.Error != nil {
		t.Fatalf("ZoneOperations.Wait = %+v, %v", op, err)
	}
	inst, err := svc.Instances.Get(gceProject, gceZone, "cp-a").Context(ctx).Do()
	if err != nil || len(inst.Disks) != 1 || inst.Disks[0].DeviceName != "etcd-a" {
		t.Errorf("Instances.Get = %+v, %v", inst, err)
	}
	checkRefused(t, f.Refused(), "")

	tests := []struct {
		name        string
		call        func(svc *compute.Service) error
		noToken     bool
		wantStatus  int
		wantReason  string
		wantRefused string
	}{
		{name: "disk in use", call: func(svc *compute.Service) error {
			_, err := svc.Instances.AttachDisk(gceProject, gceZone, "cp-a", &compute.AttachedDisk{Source: "projects/" + gceProject + "/zones/" + gceZone + "/disks/etcd-b"}).Do()
			return err
		}, wantStatus: http.StatusBadRequest, wantReason: "resourceInUseByAnotherResource"},
		{name: "no such disk", call: func(svc *compute.Service) error {
			_, err := svc.Disks.Get(gceProject, gceZone, "etcd-c").Do()
			return err
		}, wantStatus: http.StatusNotFound, wantReason: "notFound"},
		{name: "no token", noToken: true, call: func(svc *compute.Service) error {
			_, err := svc.Disks.Get(gceProject, gceZone, "etcd-a").Do()
			return err
		}, wantStatus: http.StatusUnauthorized, wantReason: "required", wantRefused: "no bearer token"},
		{name: "a source outside the zone", call: func(svc *compute.Service) error {
			_, err := svc.Instances.AttachDisk(gceProject, gceZone, "cp-a", &compute.AttachedDisk{Source: "projects/other/zones/" + gceZone + "/disks/etcd-b"}).Do()
			return err
		}, wantStatus: http.StatusBadRequest, wantReason: "invalid", wantRefused: "resource.source"},
		{name: "a filter the API does not take", call: func(svc *compute.Service) error {
			_, err := svc.Disks.List(gceProject, gceZone).Filter("name = etcd-a").Do()
			return err
		}, wantStatus: http.StatusBadRequest, wantReason: "invalid", wantRefused: "filter expression"},
		{name: "another project", call: func(svc *compute.Service) error {
			_, err := svc.Disks.Get("other", gceZone, "etcd-a").Do()
			return err
		}, wantStatus: http.StatusNotFound, wantReason: "notFound", wantRefused: "not in project kiln-test"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newComputeFake()
			srv := httptest.NewServer(f)
			defer srv.Close()
			token := gceToken
			if tt.noToken {
				token = ""
			}
			status, reason := apiCode(tt.call(computeService(t, srv, token)))
			if status != tt.wantStatus || reason != tt.wantReason {
				t.Errorf("answered %d %s, want %d %s", status, reason, tt.wantStatus, tt.wantReason)
			}
			checkRefused(t, f.Refused(), tt.wantRefused)
		})
	}
}

// TestComputeAttachFails: an attach operation Attach fails ends DONE with Attach's
// operation error code, and the disk stays free.
func TestComputeAttachFails(t *testing.T) {
	f := newComputeFake()
	f.Attach = func(string, string) error {
		return &GCEOperationError{Code: "RESOURCE_IN_USE_BY_ANOTHER_RESOURCE", Message: "The disk resource is already being used by 'cp-rival'"}
	}
	srv := httptest.NewServer(f)
	defer srv.Close()
	svc := computeService(t, srv, gceToken)
	op, err := svc.Instances.AttachDisk(gceProject, gceZone, "cp-a", &compute.AttachedDisk{
		Source: "https://www.googleapis.com/compute/v1/projects/" + gceProject + "/zones/" + gceZone + "/disks/etcd-a", DeviceName: "etcd"}).Do()
	if err != nil {
		t.Fatal(err)
	}
	op, err = svc.ZoneOperations.Wait(gceProject, gceZone, op.Name).Do()
	if err != nil || op.Status != "DONE" || op.Error == nil || op.Error.Errors[0].Code != "RESOURCE_IN_USE_BY_ANOTHER_RESOURCE" {
		t.Fatalf("ZoneOperations.Wait = %+v, %v", op, err)
	}
	f.Lock()
	defer f.Unlock()
	if d := f.Disks["etcd-a"]; len(d.Users) != 0 || len(d.Devices) != 0 {
		t.Errorf("etcd-a after a failed attach: %+v", d)
	}
	if calls := f.calls; len(calls) != 2 || calls[0].AttachedDisk == nil || calls[0].AttachedDisk.DeviceName != "etcd" ||
		!slices.Equal([]string{calls[0].Path, calls[1].Path}, []string{"instances/cp-a/attachDisk", "operations/" + op.Name + "/wait"}) {
		t.Errorf("calls %+v", calls)
	}
}
