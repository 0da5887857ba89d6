package gce

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kilnproject/kiln/initd/etcdvolume"
	"github.com/kilnproject/kiln/initd/etcdvolume/etcdvolumetest"
	"github.com/kilnproject/kiln/internal/cloudfake"
)

const (
	gceProject = "kiln-prod"
	gceZone    = "europe-west4-a"
	gceMe      = "cp-b"
	gceToken   = "ya29.kiln-test-token"
)

// newFakeCompute is the Compute API of the test project's zone holding disks, where this
// instance (gceMe) runs. Attaching a disk makes the by-id link udev would make in dev
// (none when dev is nil).
func newFakeCompute(dev *etcdvolumetest.Dev, disks map[string]*cloudfake.GCEDisk) *cloudfake.Compute {
	f := &cloudfake.Compute{Token: gceToken, Project: gceProject, Zone: gceZone, Instances: []string{gceMe}, Disks: disks}
	if dev != nil {
		f.Attach = func(_, device string) error { _, err := dev.Plug("google-"+device, "sdb"); return err }
	}
	return f
}

func newCompute(t *testing.T, f *cloudfake.Compute, token string) *ComputeService {
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	svc, err := newComputeService(srv.URL+"/compute/v1/", staticToken(token))
	if err != nil {
		t.Fatal(err)
	}
	return svc
}

// gceCase is the disks a fake Compute API holds and what attaching the etcd disk must do.
type gceCase struct {
	name        string
	disks       map[string][]string // disk name → the instances using it
	deviceNames map[string]string   // "instance/disk" → its device name there
	// race, when set, makes attachDisk lose to another instance: "request" has the request
	// refused, "operation" the operation fail.
	race       string
	diskName   string
	labels     map[string]string            // the selector, when there is no diskName
	diskLabels map[string]map[string]string // the disks' labels
	wantDisk   string                       // the disk a label selector selects
	wantAttach []string                     // device names attachDisk was called with
	wantLink   string                       // the by-id link Find resolves
	wantErr    error
	wantMsg    string
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
		wantErr:  etcdvolume.ErrAttachedElsewhere,
		wantMsg:  "instances/cp-old",
	},
	{
		name:       "another instance wins the race: request refused",
		disks:      map[string][]string{"prod-etcd-b": nil},
		race:       "request",
		diskName:   "prod-etcd-b",
		wantAttach: []string{"prod-etcd-b"},
		wantErr:    etcdvolume.ErrAttachedElsewhere,
		wantMsg:    "already being used by",
	},
	{
		name:       "another instance wins the race: operation fails",
		disks:      map[string][]string{"prod-etcd-b": nil},
		race:       "operation",
		diskName:   "prod-etcd-b",
		wantAttach: []string{"prod-etcd-b"},
		wantErr:    etcdvolume.ErrAttachedElsewhere,
		wantMsg:    "RESOURCE_IN_USE_BY_ANOTHER_RESOURCE",
	},
	{
		name:     "no such disk",
		disks:    map[string][]string{},
		diskName: "prod-etcd-b",
		wantErr:  etcdvolume.ErrNotFound,
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
		wantErr:    etcdvolume.ErrNotFound,
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
	dev := etcdvolumetest.NewDev(t)
	// The fake attaches disks by changing its own copy: the case table stays as written, so a
	// second run (go test -count=2) starts from the same disks.
	disks := map[string]*cloudfake.GCEDisk{}
	for name, users := range tt.disks {
		disks[name] = &cloudfake.GCEDisk{Users: slices.Clone(users), Labels: tt.diskLabels[name], Devices: map[string]string{}}
	}
	for k, v := range tt.deviceNames {
		instance, disk, _ := strings.Cut(k, "/")
		disks[disk].Devices[instance] = v
		dev.Link("google-"+v, "sdb")
	}
	f := newFakeCompute(dev, disks)
	switch tt.race {
	case "request": // another instance takes the disk just before the request
		f.BeforeAttach = func(_ string, d *cloudfake.GCEDisk) { d.Users = []string{"cp-rival"} }
	case "operation": // or while the operation runs
		f.Attach = func(string, string) error {
			return &cloudfake.GCEOperationError{Code: "RESOURCE_IN_USE_BY_ANOTHER_RESOURCE", Message: "The disk resource is already being used by 'cp-rival'"}
		}
	}
	g := Disk{
		Service: newCompute(t, f, gceToken), Project: gceProject, Zone: gceZone, Instance: gceMe,
		DiskName: tt.diskName, Labels: tt.labels, DevDir: dev.ByID, Timeout: 5 * time.Second, Poll: 10 * time.Millisecond, Log: quiet,
	}
	got, err := g.Find(context.Background())
	noRefusals(t, f.Refused())
	calls := f.Calls()
	var attached []string
	for _, c := range calls {
		if ad := c.AttachedDisk; ad != nil {
			attached = append(attached, ad.DeviceName)
			if ad.Mode != "READ_WRITE" || ad.Type != "PERSISTENT" {
				t.Errorf("attachDisk of %+v; want a persistent disk read-write", ad)
			}
		}
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
		t.Fatalf("Find: %v (requests %+v)", err, calls)
	}
	if got != dev.Devs+"/sdb" {
		t.Errorf("Find = %q, want %s", got, dev.Devs+"/sdb")
	}
	f.Lock()
	defer f.Unlock()
	if users := f.Disks[tt.diskName+tt.wantDisk].Users; !slices.Equal(users, []string{gceMe}) {
		t.Errorf("disk users = %q", users)
	}
}

// TestGCEWithoutToken: the fake insists on the bearer token, so the tests above prove
// the client sends it.
func TestGCEWithoutToken(t *testing.T) {
	f := newFakeCompute(etcdvolumetest.NewDev(t), map[string]*cloudfake.GCEDisk{"d": {}})
	srv := httptest.NewServer(f)
	defer srv.Close()
	svc, err := newComputeService(srv.URL+"/compute/v1/", nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = Disk{Service: svc, Project: gceProject, Zone: gceZone, Instance: gceMe, DiskName: "d"}.Find(context.Background())
	if err == nil || !strings.Contains(err.Error(), "401") {
		t.Errorf("Find without a token = %v; want a 401", err)
	}
	if refused := f.Refused(); len(refused) != 1 {
		t.Errorf("refused requests = %q", refused)
	}
}

func TestGCEBadConfig(t *testing.T) {
	if _, err := (Disk{}).Find(context.Background()); err == nil || !strings.Contains(err.Error(), "no compute service") {
		t.Errorf("Find = %v", err)
	}
	if _, err := (Disk{Service: &ComputeService{}, Project: "p"}).Find(context.Background()); err == nil || !strings.Contains(err.Error(), "are required") {
		t.Errorf("Find = %v", err)
	}
}

// noRefusals fails t with the requests a fake refused: requests the cloud would refuse.
func noRefusals(t *testing.T, refused []string) {
	t.Helper()
	if len(refused) > 0 {
		t.Errorf("the fake refused requests the cloud would refuse:\n%s", strings.Join(refused, "\n"))
	}
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// TestFinderRefusesPartition: the disk finder checks the device the disk's link leads to
// like etcdvolume.ByID does: a link to a partition is refused, naming the disk.
func TestFinderRefusesPartition(t *testing.T) {
	etcdvolumetest.NeedTools(t, "losetup", "sgdisk", "partx")
	part := etcdvolumetest.LoopDisk(t, true) + "p1"
	byID := t.TempDir()
	if err := os.Symlink(part, filepath.Join(byID, "google-prod-etcd-b")); err != nil {
		t.Fatal(err)
	}
	f := newFakeCompute(nil, map[string]*cloudfake.GCEDisk{
		"prod-etcd-b": {Users: []string{gceMe}, Devices: map[string]string{gceMe: "prod-etcd-b"}}})
	t.Cleanup(func() { noRefusals(t, f.Refused()) })
	finder := Disk{Service: newCompute(t, f, gceToken), Project: gceProject, Zone: gceZone, Instance: gceMe,
		DiskName: "prod-etcd-b", DevDir: byID, Timeout: time.Minute, Poll: 10 * time.Millisecond, Log: quiet}
	const selector = "gce disk prod-etcd-b: "
	got, err := finder.Find(context.Background())
	if !errors.Is(err, etcdvolume.ErrUnsafeDisk) || !strings.Contains(err.Error(), selector+part+" is ") ||
		!strings.Contains(err.Error(), "is partition loop") {
		t.Fatalf("Find = %q, %v; want the partition refused, naming %q", got, err, selector)
	}
	t.Log(err)
}
