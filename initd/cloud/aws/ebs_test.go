package aws

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"maps"
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
	testRegion = "eu-west-1"
	testAZ     = "eu-west-1a"
	testAKID   = "AKIDKILNTEST"
	testSecret = "kiln-test-secret"
	me         = "i-0me"
)

var testCreds = cloudfake.AWSCredentials{AccessKeyID: testAKID, SecretAccessKey: testSecret}

// newFakeEC2 is an EC2 of the test region holding vols, where this instance (me) runs in
// testAZ. An attachment is reported attached at the second DescribeVolumes answer that
// shows it, and attaching a volume makes the NVMe by-id link udev would make in dev
// (none when dev is nil).
func newFakeEC2(dev *etcdvolumetest.Dev, vols []*cloudfake.EC2Volume) *cloudfake.EC2 {
	f := &cloudfake.EC2{Creds: testCreds, Region: testRegion, Instances: map[string]string{me: testAZ}, Volumes: vols, SettleLooks: 1}
	if dev != nil {
		f.Attach = func(id, _ string) error { _, err := dev.Plug("aws-ebs-"+id, "nvme1n1"); return err }
	}
	return f
}

// attachedTo attaches v to instance right away (another node, or a previous boot).
func attachedTo(v *cloudfake.EC2Volume, instance, device string) *cloudfake.EC2Volume {
	v.State = "in-use"
	v.Attachments = []cloudfake.EC2Attachment{{Instance: instance, Device: device, State: "attached"}}
	return v
}

// ec2Calls are f's AttachVolume calls as "volume instance device", and the filters of its
// DescribeVolumes calls as "name=value,… name=…".
func ec2Calls(f *cloudfake.EC2) (attaches, filters []string) {
	for _, c := range f.Calls() {
		switch c.Action {
		case "AttachVolume":
			attaches = append(attaches, c.VolumeIDs[0]+" "+c.Instance+" "+c.Device)
		case "DescribeVolumes":
			filters = append(filters, strings.Join(c.Filters, " "))
		}
	}
	return attaches, filters
}

// noRefusals fails t with the requests a fake refused: requests the cloud would refuse.
func noRefusals(t *testing.T, refused []string) {
	t.Helper()
	if len(refused) > 0 {
		t.Errorf("the fake refused requests the cloud would refuse:\n%s", strings.Join(refused, "\n"))
	}
}

func newEC2(t *testing.T, f *cloudfake.EC2) *EC2Client {
	return newEC2Signed(t, f, testSecret)
}

// newEC2Signed is a client of f that signs with secret.
func newEC2Signed(t *testing.T, f *cloudfake.EC2, secret string) *EC2Client {
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	c, err := newEC2Client(srv.URL, testRegion, staticCredentials{AccessKeyID: testAKID, SecretAccessKey: secret})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// etcdVolumes are kOps-style volumes of cluster prod: one per member a, b, c in the
// node's zone, plus decoys: member b's volume of another cluster and of another zone.
func etcdVolumes() []*cloudfake.EC2Volume {
	vol := func(id, az, cluster, member string) *cloudfake.EC2Volume {
		return &cloudfake.EC2Volume{ID: id, AZ: az, State: "available", Tags: map[string]string{
			"kubernetes.io/cluster/" + cluster: "owned",
			"k8s.io/etcd/main":                 member + "/a,b,c",
			"k8s.io/role/control-plane":        "1",
			"Name":                             member + ".etcd-main." + cluster,
		}}
	}
	return []*cloudfake.EC2Volume{
		attachedTo(vol("vol-0a", testAZ, "prod", "a"), "i-0a", "/dev/xvdu"),
		vol("vol-0b", testAZ, "prod", "b"),
		vol("vol-0c", testAZ, "prod", "c"),
		vol("vol-0bstaging", testAZ, "staging", "b"),
		vol("vol-0bzoneb", "eu-west-1b", "prod", "b"),
	}
}

// volume is the volume of vols with id.
func volume(vols []*cloudfake.EC2Volume, id string) *cloudfake.EC2Volume {
	for _, v := range vols {
		if v.ID == id {
			return v
		}
	}
	return nil
}

// awsCase is the EC2 volumes an etcd member finds and what attaching its own must do.
type awsCase struct {
	name         string
	vols         func() []*cloudfake.EC2Volume
	beforeAttach func(v *cloudfake.EC2Volume)
	member       string
	wantAttaches []string
	wantErr      error
	wantMsg      string
}

var awsCases = []awsCase{
	{
		name:         "available volume is attached",
		vols:         etcdVolumes,
		member:       "b",
		wantAttaches: []string{"vol-0b " + me + " /dev/xvdu"},
	},
	{
		name: "volume attached to this instance (a reboot) is used as it is",
		vols: func() []*cloudfake.EC2Volume {
			v := etcdVolumes()
			attachedTo(v[1], me, "/dev/xvdu")
			return v
		},
		member: "b",
	},
	{
		name: "attachment started by a previous attempt is waited for",
		vols: func() []*cloudfake.EC2Volume {
			v := etcdVolumes()
			v[1].State, v[1].Attachments = "in-use", []cloudfake.EC2Attachment{{Instance: me, Device: "/dev/xvdu", State: "attaching"}}
			return v
		},
		member: "b",
	},
	{
		name: "the first free device name is used",
		vols: func() []*cloudfake.EC2Volume {
			v := etcdVolumes()
			root := &cloudfake.EC2Volume{ID: "vol-0root", AZ: testAZ, Tags: map[string]string{}}
			other := &cloudfake.EC2Volume{ID: "vol-0data", AZ: testAZ, Tags: map[string]string{}}
			return append(v, attachedTo(root, me, "/dev/xvda"), attachedTo(other, me, "/dev/xvdu"))
		},
		member:       "b",
		wantAttaches: []string{"vol-0b " + me + " /dev/xvdv"},
	},
	{
		name: "volume held by another instance",
		vols: func() []*cloudfake.EC2Volume {
			v := etcdVolumes()
			attachedTo(v[1], "i-0old", "/dev/xvdu")
			return v
		},
		member:  "b",
		wantErr: etcdvolume.ErrAttachedElsewhere,
		wantMsg: "vol-0b: volume is attached to another instance (i-0old, attached)",
	},
	{
		name:   "another instance wins the attach race",
		vols:   etcdVolumes,
		member: "b",
		beforeAttach: func(v *cloudfake.EC2Volume) {
			attachedTo(v, "i-0rival", "/dev/xvdu")
		},
		wantAttaches: []string{"vol-0b " + me + " /dev/xvdu"},
		wantErr:      etcdvolume.ErrAttachedElsewhere,
		wantMsg:      "i-0rival",
	},
	{
		name:    "no volume for the member",
		vols:    etcdVolumes,
		member:  "d",
		wantErr: etcdvolume.ErrNotFound,
		wantMsg: "for member d in eu-west-1a (tag k8s.io/etcd/main=d/…, 3 volumes match the other filters)",
	},
	{
		name: "two volumes for the member",
		vols: func() []*cloudfake.EC2Volume {
			v := etcdVolumes()
			dup := &cloudfake.EC2Volume{ID: "vol-0b2", AZ: testAZ, State: "available", Tags: maps.Clone(v[1].Tags)}
			return append(v, dup)
		},
		member:  "b",
		wantMsg: "2 volumes are tagged for member b (vol-0b, vol-0b2); expected one",
	},
}

func TestAWS(t *testing.T) {
	for _, tt := range awsCases {
		t.Run(tt.name, func(t *testing.T) { checkAWS(t, tt) })
	}
}

// checkAWS attaches tt.member's volume against a fake EC2 holding tt.vols and checks the outcome.
func checkAWS(t *testing.T, tt awsCase) {
	dev := etcdvolumetest.NewDev(t)
	f := newFakeEC2(dev, tt.vols())
	f.BeforeAttach = tt.beforeAttach
	// A volume this instance holds, or is being given, from an earlier run was plugged then.
	for _, v := range f.Volumes {
		if len(v.Attachments) > 0 && v.Attachments[0].Instance == me && v.Attachments[0].State != "detached" {
			dev.Link("aws-ebs-"+v.ID, "nvme1n1")
		}
	}
	finder := EBS{
		Client: newEC2(t, f), InstanceID: me, AZ: testAZ, Cluster: "prod", Member: tt.member,
		DevDir: dev.ByID, Timeout: 5 * time.Second, Poll: 10 * time.Millisecond, Log: quiet,
	}
	got, err := finder.Find(context.Background())
	noRefusals(t, f.Refused())
	attaches, filters := ec2Calls(f)
	if !slices.Equal(attaches, tt.wantAttaches) {
		t.Errorf("AttachVolume calls = %q, want %q", attaches, tt.wantAttaches)
	}
	if want := "availability-zone=eu-west-1a tag:kubernetes.io/cluster/prod=owned tag-key=k8s.io/etcd/main"; len(filters) == 0 || filters[0] != want {
		t.Errorf("first DescribeVolumes filters = %q, want %q", filters, want)
	}
	f.Lock()
	defer f.Unlock()
	if tt.wantErr != nil || tt.wantMsg != "" {
		if err == nil || (tt.wantErr != nil && !errors.Is(err, tt.wantErr)) || !strings.Contains(err.Error(), tt.wantMsg) {
			t.Fatalf("Find = %q, %v; want %v with %q", got, err, tt.wantErr, tt.wantMsg)
		}
		// No other member's volume was taken.
		for _, v := range f.Volumes {
			for _, a := range v.Attachments {
				if a.Instance == me && v.ID != "vol-0root" && v.ID != "vol-0data" {
					t.Errorf("%s got attached to this instance", v.ID)
				}
			}
		}
		return
	}
	if err != nil {
		t.Fatalf("Find: %v", err)
	}
	if want := dev.Devs + "/nvme1n1"; got != want {
		t.Errorf("Find = %q, want %q", got, want)
	}
	if v := volume(f.Volumes, "vol-0b"); len(v.Attachments) != 1 || v.Attachments[0].Instance != me || v.Attachments[0].State != "attached" {
		t.Errorf("vol-0b attachments = %+v", v.Attachments)
	}
	if v := volume(f.Volumes, "vol-0c"); len(v.Attachments) != 0 {
		t.Errorf("member c's volume was attached: %+v", v.Attachments)
	}
}

func TestAWSExtraTagsAndEtcdCluster(t *testing.T) {
	dev := etcdvolumetest.NewDev(t)
	vols := etcdVolumes()
	events := &cloudfake.EC2Volume{ID: "vol-0bev", AZ: testAZ, State: "available", Tags: map[string]string{
		"kubernetes.io/cluster/prod": "owned", "k8s.io/etcd/events": "b/a,b,c", "team": "infra", "k8s.io/role/control-plane": "1",
	}}
	f := newFakeEC2(dev, append(vols, events))
	finder := EBS{
		Client: newEC2(t, f), InstanceID: me, AZ: testAZ, Cluster: "prod", Member: "b",
		EtcdCluster: "events", Tags: map[string]string{"team": "infra", "k8s.io/role/control-plane": ""},
		DevDir: dev.ByID, Poll: 10 * time.Millisecond, Log: quiet,
	}
	got, err := finder.Find(context.Background())
	if err != nil || got != dev.Devs+"/nvme1n1" {
		t.Fatalf("Find = %q, %v", got, err)
	}
	noRefusals(t, f.Refused())
	attaches, filters := ec2Calls(f)
	want := "availability-zone=eu-west-1a tag:kubernetes.io/cluster/prod=owned tag-key=k8s.io/etcd/events tag-key=k8s.io/role/control-plane tag:team=infra"
	if filters[0] != want {
		t.Errorf("filters = %q, want %q", filters[0], want)
	}
	if !slices.Equal(attaches, []string{"vol-0bev " + me + " /dev/xvdu"}) {
		t.Errorf("attaches = %q", attaches)
	}
}

// An image without kiln's udev rule still finds the volume on EC2 through systemd's stock
// link (model string and serial), and on a Xen instance through the device name it was
// attached under.
func TestAWSFallbackLinks(t *testing.T) {
	for name, link := range map[string]string{
		"stock NVMe link": "nvme-Amazon_Elastic_Block_Store_vol0b",
		"Xen device name": "",
	} {
		t.Run(name, func(t *testing.T) {
			dev := etcdvolumetest.NewDev(t)
			vols := etcdVolumes()
			xvdu := filepath.Join(dev.Devs, "xvdu")
			attachedTo(vols[1], me, xvdu) // member b's volume, attached by an earlier run
			want := filepath.Join(dev.Devs, "nvme2n1")
			if link != "" {
				dev.Link(link, "nvme2n1")
			} else {
				want = dev.Link("unrelated", "xvdu")
			}
			f := newFakeEC2(dev, vols)
			finder := EBS{Client: newEC2(t, f), InstanceID: me, AZ: testAZ, Cluster: "prod", Member: "b",
				DevDir: dev.ByID, Timeout: 5 * time.Second, Poll: 10 * time.Millisecond, Log: quiet}
			got, err := finder.Find(context.Background())
			if err != nil || got != want {
				t.Fatalf("Find = %q, %v; want %q", got, err, want)
			}
			noRefusals(t, f.Refused())
			if attaches, _ := ec2Calls(f); len(attaches) != 0 {
				t.Errorf("attached again: %q", attaches)
			}
		})
	}
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// TestFakeEC2ChecksSignatures: the fake refuses a request signed with another secret,
// so the other tests prove the SDK client signs as AWS expects.
func TestFakeEC2ChecksSignatures(t *testing.T) {
	f := newFakeEC2(nil, etcdVolumes())
	_, err := EBS{Client: newEC2Signed(t, f, "wrong-secret"), InstanceID: me, AZ: testAZ, Member: "b"}.Find(context.Background())
	if refused := f.Refused(); len(refused) != 1 || !strings.Contains(refused[0], "signature does not match") {
		t.Errorf("refused requests = %q; want the wrongly signed request", refused)
	}
	if err == nil || !strings.Contains(err.Error(), "AuthFailure") {
		t.Errorf("Find = %v; want the AuthFailure", err)
	}
}

func TestAWSBadConfig(t *testing.T) {
	for _, a := range []EBS{{}, {Client: &EC2Client{}}, {Client: &EC2Client{}, InstanceID: me, AZ: testAZ}} {
		if _, err := a.Find(context.Background()); err == nil || !strings.Contains(err.Error(), "aws volume: ") {
			t.Errorf("Find(%+v) = %v; want a configuration error", a, err)
		}
	}
}

// TestFinderRefusesPartition: the EBS finder checks the device the volume's link leads to
// like etcdvolume.ByID does: a link to a partition is refused, naming the volume.
func TestFinderRefusesPartition(t *testing.T) {
	etcdvolumetest.NeedTools(t, "losetup", "sgdisk", "partx")
	part := etcdvolumetest.LoopDisk(t, true) + "p1"
	byID := t.TempDir()
	if err := os.Symlink(part, filepath.Join(byID, "nvme-Amazon_Elastic_Block_Store_vol0b")); err != nil {
		t.Fatal(err)
	}
	vols := etcdVolumes()
	attachedTo(volume(vols, "vol-0b"), me, "/dev/xvdu")
	f := newFakeEC2(nil, vols)
	t.Cleanup(func() { noRefusals(t, f.Refused()) })
	finder := EBS{Client: newEC2(t, f), InstanceID: me, AZ: testAZ, Cluster: "prod", Member: "b",
		DevDir: byID, Timeout: time.Minute, Poll: 10 * time.Millisecond, Log: quiet}
	const selector = "aws volume vol-0b (k8s.io/etcd/main, member b): "
	got, err := finder.Find(context.Background())
	if !errors.Is(err, etcdvolume.ErrUnsafeDisk) || !strings.Contains(err.Error(), selector+part+" is ") ||
		!strings.Contains(err.Error(), "is partition loop") {
		t.Fatalf("Find = %q, %v; want the partition refused, naming %q", got, err, selector)
	}
	t.Log(err)
}
