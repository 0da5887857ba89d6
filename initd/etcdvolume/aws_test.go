package etcdvolume

import (
	"bytes"
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/ec2"

	"github.com/kilnproject/kiln/internal/cloudfake"
)

const (
	testRegion = "eu-west-1"
	testAZ     = "eu-west-1a"
	testAKID   = "AKIDKILNTEST"
	testSecret = "kiln-test-secret"
	me         = "i-0me"
)

// fakeEC2 answers the EC2 Query API (form-encoded POST, XML answers) for
// DescribeVolumes and AttachVolume as EC2 does, after checking each request's SigV4
// signature. It keeps volume state, and on attachment makes the NVMe by-id link udev
// would make.
type fakeEC2 struct {
	t    *testing.T
	dev  *fakeDev
	mu   sync.Mutex
	vols []*fakeVol
	// beforeAttach, when set, runs inside AttachVolume before the fake looks at the
	// volume: the place for another instance to win the race.
	beforeAttach func(f *fakeEC2, volID string)
	attaches     []string // "vol instance device" of every AttachVolume call
	filters      []string // the filters of every DescribeVolumes call, "name=v1,v2" joined by " "
}

type fakeVol struct {
	id, az, state string
	tags          map[string]string
	att           []fakeAtt
	describes     int // DescribeVolumes answers since the attachment started
}

type fakeAtt struct{ instance, device, state string }

func (f *fakeEC2) vol(id string) *fakeVol {
	for _, v := range f.vols {
		if v.id == id {
			return v
		}
	}
	return nil
}

// attachedTo attaches v to instance right away (another node, or a previous boot).
func (v *fakeVol) attachedTo(instance, device string) *fakeVol {
	v.state = "in-use"
	v.att = []fakeAtt{{instance, device, "attached"}}
	return v
}

func (f *fakeEC2) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	if err := verifySigV4(r, body); err != nil {
		f.t.Errorf("request not signed as AWS would accept: %v", err)
		ec2Error(w, http.StatusUnauthorized, "AuthFailure", "AWS was not able to validate the provided access credentials")
		return
	}
	if ct := r.Header.Get("Content-Type"); r.Method != http.MethodPost || !strings.HasPrefix(ct, "application/x-www-form-urlencoded") {
		f.t.Errorf("%s with Content-Type %q; EC2 wants a form POST", r.Method, ct)
	}
	form, err := url.ParseQuery(string(body))
	if err != nil || form.Get("Version") != "2016-11-15" {
		f.t.Errorf("bad query body %q: %v", body, err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	switch form.Get("Action") {
	case "DescribeVolumes":
		f.describeVolumes(w, form)
	case "AttachVolume":
		f.attachVolume(w, form)
	default:
		f.t.Errorf("unexpected action %q", form.Get("Action"))
		ec2Error(w, http.StatusBadRequest, "InvalidAction", "The action "+form.Get("Action")+" is not valid for this web service.")
	}
}

// indexed returns the values of prefix.1, prefix.2, … (the Query API's lists).
func indexed(form url.Values, prefix string) []string {
	var out []string
	for i := 1; form.Has(prefix + "." + strconv.Itoa(i)); i++ {
		out = append(out, form.Get(prefix+"."+strconv.Itoa(i)))
	}
	return out
}

func (f *fakeEC2) describeVolumes(w http.ResponseWriter, form url.Values) {
	type filter struct {
		name   string
		values []string
	}
	var filters []filter
	var desc []string
	for i := 1; form.Has(fmt.Sprintf("Filter.%d.Name", i)); i++ {
		fl := filter{form.Get(fmt.Sprintf("Filter.%d.Name", i)), indexed(form, fmt.Sprintf("Filter.%d.Value", i))}
		filters = append(filters, fl)
		desc = append(desc, fl.name+"="+strings.Join(fl.values, ","))
	}
	f.filters = append(f.filters, strings.Join(desc, " "))
	ids := indexed(form, "VolumeId")
	match := func(v *fakeVol) (bool, error) {
		if len(ids) > 0 && !slices.Contains(ids, v.id) {
			return false, nil
		}
		for _, fl := range filters {
			ok := false
			for _, val := range fl.values {
				switch {
				case fl.name == "availability-zone":
					ok = ok || v.az == val
				case fl.name == "tag-key":
					_, has := v.tags[val]
					ok = ok || has
				case strings.HasPrefix(fl.name, "tag:"):
					tv, has := v.tags[strings.TrimPrefix(fl.name, "tag:")]
					ok = ok || has && tv == val
				case fl.name == "attachment.instance-id":
					for _, a := range v.att {
						ok = ok || a.instance == val
					}
				default:
					return false, fmt.Errorf("The filter '%s' is invalid", fl.name)
				}
			}
			if !ok {
				return false, nil
			}
		}
		return true, nil
	}
	var b strings.Builder
	b.WriteString(`<?xml version="1.0" encoding="UTF-8"?>
<DescribeVolumesResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/"><requestId>req-1</requestId><volumeSet>`)
	for _, v := range f.vols {
		ok, err := match(v)
		if err != nil {
			ec2Error(w, http.StatusBadRequest, "InvalidParameterValue", err.Error())
			return
		}
		if !ok {
			continue
		}
		// An attachment in progress completes at the second look, and udev then
		// makes the device link (the kiln image's rule).
		for i, a := range v.att {
			if a.state == "attaching" {
				if v.describes++; v.describes >= 2 {
					v.att[i].state = "attached"
					f.dev.link("aws-ebs-"+v.id, "nvme1n1")
				}
			}
		}
		fmt.Fprintf(&b, `<item><volumeId>%s</volumeId><size>8</size><snapshotId/><availabilityZone>%s</availabilityZone><status>%s</status><createTime>2026-01-01T00:00:00.000Z</createTime><attachmentSet>`, v.id, v.az, v.state)
		for _, a := range v.att {
			fmt.Fprintf(&b, `<item><volumeId>%s</volumeId><instanceId>%s</instanceId><device>%s</device><status>%s</status><attachTime>2026-01-01T00:00:00.000Z</attachTime><deleteOnTermination>false</deleteOnTermination></item>`, v.id, a.instance, a.device, a.state)
		}
		b.WriteString(`</attachmentSet><tagSet>`)
		for k, val := range v.tags {
			fmt.Fprintf(&b, `<item><key>%s</key><value>%s</value></item>`, xmlEscape(k), xmlEscape(val))
		}
		b.WriteString(`</tagSet><volumeType>gp3</volumeType><encrypted>true</encrypted></item>`)
	}
	b.WriteString(`</volumeSet></DescribeVolumesResponse>`)
	w.Header().Set("Content-Type", "text/xml;charset=UTF-8")
	io.WriteString(w, b.String())
}

func (f *fakeEC2) attachVolume(w http.ResponseWriter, form url.Values) {
	id, instance, device := form.Get("VolumeId"), form.Get("InstanceId"), form.Get("Device")
	f.attaches = append(f.attaches, id+" "+instance+" "+device)
	if f.beforeAttach != nil {
		f.beforeAttach(f, id)
	}
	v := f.vol(id)
	switch {
	case id == "" || instance == "" || device == "":
		ec2Error(w, http.StatusBadRequest, "MissingParameter", "The request must contain the parameters VolumeId, InstanceId and Device")
		return
	case v == nil:
		ec2Error(w, http.StatusBadRequest, "InvalidVolume.NotFound", "The volume '"+id+"' does not exist.")
		return
	case v.state != "available":
		ec2Error(w, http.StatusBadRequest, "IncorrectState", "vol '"+id+"' is already attached to an instance")
		return
	case v.az != testAZ:
		ec2Error(w, http.StatusBadRequest, "InvalidVolume.ZoneMismatch", "The volume '"+id+"' is not in the same availability zone as instance '"+instance+"'")
		return
	}
	for _, other := range f.vols {
		for _, a := range other.att {
			if a.instance == instance && a.device == device {
				ec2Error(w, http.StatusBadRequest, "InvalidParameterValue", "Invalid value '"+device+"' for unixDevice. Attachment point "+device+" is already in use")
				return
			}
		}
	}
	v.state = "in-use"
	v.att = []fakeAtt{{instance, device, "attaching"}}
	w.Header().Set("Content-Type", "text/xml;charset=UTF-8")
	fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?>
<AttachVolumeResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/"><requestId>req-2</requestId><volumeId>%s</volumeId><instanceId>%s</instanceId><device>%s</device><status>attaching</status><attachTime>2026-01-01T00:00:00.000Z</attachTime></AttachVolumeResponse>`, id, instance, device)
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

// verifySigV4 checks r as AWS does (cloudfake.CheckSigV4) with the test credentials, and
// that it was signed for EC2 in the test region.
func verifySigV4(r *http.Request, body []byte) error {
	scope, err := cloudfake.CheckSigV4(r, body, cloudfake.AWSCredentials{AccessKeyID: testAKID, SecretAccessKey: testSecret})
	if err != nil {
		return err
	}
	if scope.Region != testRegion || scope.Service != "ec2" {
		return fmt.Errorf("credential scope %s/%s, want %s/ec2", scope.Region, scope.Service, testRegion)
	}
	return nil
}

func newEC2(t *testing.T, f *fakeEC2) *ec2.Client {
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	return ec2.New(ec2.Options{
		Region:       testRegion,
		Credentials:  credentials.NewStaticCredentialsProvider(testAKID, testSecret, ""),
		BaseEndpoint: aws.String(srv.URL),
		HTTPClient:   srv.Client(),
	})
}

// etcdVolumes are kOps-style volumes of cluster prod: one per member a, b, c in the
// node's zone, plus decoys: member b's volume of another cluster and of another zone.
func etcdVolumes() []*fakeVol {
	vol := func(id, az, cluster, member string) *fakeVol {
		return &fakeVol{id: id, az: az, state: "available", tags: map[string]string{
			"kubernetes.io/cluster/" + cluster: "owned",
			"k8s.io/etcd/main":                 member + "/a,b,c",
			"k8s.io/role/control-plane":        "1",
			"Name":                             member + ".etcd-main." + cluster,
		}}
	}
	return []*fakeVol{
		vol("vol-0a", testAZ, "prod", "a").attachedTo("i-0a", "/dev/xvdu"),
		vol("vol-0b", testAZ, "prod", "b"),
		vol("vol-0c", testAZ, "prod", "c"),
		vol("vol-0bstaging", testAZ, "staging", "b"),
		vol("vol-0bzoneb", "eu-west-1b", "prod", "b"),
	}
}

// awsCase is the EC2 volumes an etcd member finds and what attaching its own must do.
type awsCase struct {
	name         string
	vols         func() []*fakeVol
	beforeAttach func(f *fakeEC2, volID string)
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
		vols: func() []*fakeVol {
			v := etcdVolumes()
			v[1].attachedTo(me, "/dev/xvdu")
			return v
		},
		member: "b",
	},
	{
		name: "attachment started by a previous attempt is waited for",
		vols: func() []*fakeVol {
			v := etcdVolumes()
			v[1].state, v[1].att = "in-use", []fakeAtt{{me, "/dev/xvdu", "attaching"}}
			return v
		},
		member: "b",
	},
	{
		name: "the first free device name is used",
		vols: func() []*fakeVol {
			v := etcdVolumes()
			root := &fakeVol{id: "vol-0root", az: testAZ, state: "in-use", tags: map[string]string{}}
			other := &fakeVol{id: "vol-0data", az: testAZ, state: "in-use", tags: map[string]string{}}
			return append(v, root.attachedTo(me, "/dev/xvda"), other.attachedTo(me, "/dev/xvdu"))
		},
		member:       "b",
		wantAttaches: []string{"vol-0b " + me + " /dev/xvdv"},
	},
	{
		name: "volume held by another instance",
		vols: func() []*fakeVol {
			v := etcdVolumes()
			v[1].attachedTo("i-0old", "/dev/xvdu")
			return v
		},
		member:  "b",
		wantErr: errAttachedElsewhere,
		wantMsg: "vol-0b: volume is attached to another instance (i-0old, attached)",
	},
	{
		name:   "another instance wins the attach race",
		vols:   etcdVolumes,
		member: "b",
		beforeAttach: func(f *fakeEC2, volID string) {
			f.vol(volID).attachedTo("i-0rival", "/dev/xvdu")
		},
		wantAttaches: []string{"vol-0b " + me + " /dev/xvdu"},
		wantErr:      errAttachedElsewhere,
		wantMsg:      "i-0rival",
	},
	{
		name:    "no volume for the member",
		vols:    etcdVolumes,
		member:  "d",
		wantErr: errNotFound,
		wantMsg: "for member d in eu-west-1a (tag k8s.io/etcd/main=d/…, 3 volumes match the other filters)",
	},
	{
		name: "two volumes for the member",
		vols: func() []*fakeVol {
			v := etcdVolumes()
			dup := &fakeVol{id: "vol-0b2", az: testAZ, state: "available", tags: map[string]string{}}
			for k, val := range v[1].tags {
				dup.tags[k] = val
			}
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
	dev := newFakeDev(t)
	f := &fakeEC2{t: t, dev: dev, vols: tt.vols(), beforeAttach: tt.beforeAttach}
	for _, v := range f.vols {
		if len(v.att) > 0 && v.att[0].instance == me && v.att[0].state == "attached" {
			dev.link("aws-ebs-"+v.id, "nvme1n1")
		}
	}
	finder := AWS{
		Client: newEC2(t, f), InstanceID: me, AZ: testAZ, Cluster: "prod", Member: tt.member,
		DevDir: dev.byID, Timeout: 5 * time.Second, Poll: 10 * time.Millisecond, Log: quiet,
	}
	got, err := finder.Find(context.Background())
	f.mu.Lock()
	defer f.mu.Unlock()
	if !slices.Equal(f.attaches, tt.wantAttaches) {
		t.Errorf("AttachVolume calls = %q, want %q", f.attaches, tt.wantAttaches)
	}
	if want := "availability-zone=eu-west-1a tag:kubernetes.io/cluster/prod=owned tag-key=k8s.io/etcd/main"; len(f.filters) == 0 || f.filters[0] != want {
		t.Errorf("first DescribeVolumes filters = %q, want %q", f.filters, want)
	}
	if tt.wantErr != nil || tt.wantMsg != "" {
		if err == nil || (tt.wantErr != nil && !errors.Is(err, tt.wantErr)) || !strings.Contains(err.Error(), tt.wantMsg) {
			t.Fatalf("Find = %q, %v; want %v with %q", got, err, tt.wantErr, tt.wantMsg)
		}
		// No other member's volume was taken.
		for _, v := range f.vols {
			for _, a := range v.att {
				if a.instance == me && v.id != "vol-0root" && v.id != "vol-0data" {
					t.Errorf("%s got attached to this instance", v.id)
				}
			}
		}
		return
	}
	if err != nil {
		t.Fatalf("Find: %v", err)
	}
	if want := dev.devs + "/nvme1n1"; got != want {
		t.Errorf("Find = %q, want %q", got, want)
	}
	if v := f.vol("vol-0b"); len(v.att) != 1 || v.att[0].instance != me || v.att[0].state != "attached" {
		t.Errorf("vol-0b attachments = %+v", v.att)
	}
	if v := f.vol("vol-0c"); len(v.att) != 0 {
		t.Errorf("member c's volume was attached: %+v", v.att)
	}
}

func TestAWSExtraTagsAndEtcdCluster(t *testing.T) {
	dev := newFakeDev(t)
	vols := etcdVolumes()
	events := &fakeVol{id: "vol-0bev", az: testAZ, state: "available", tags: map[string]string{
		"kubernetes.io/cluster/prod": "owned", "k8s.io/etcd/events": "b/a,b,c", "team": "infra", "k8s.io/role/control-plane": "1",
	}}
	f := &fakeEC2{t: t, dev: dev, vols: append(vols, events)}
	finder := AWS{
		Client: newEC2(t, f), InstanceID: me, AZ: testAZ, Cluster: "prod", Member: "b",
		EtcdCluster: "events", Tags: map[string]string{"team": "infra", "k8s.io/role/control-plane": ""},
		DevDir: dev.byID, Poll: 10 * time.Millisecond, Log: quiet,
	}
	got, err := finder.Find(context.Background())
	if err != nil || got != dev.devs+"/nvme1n1" {
		t.Fatalf("Find = %q, %v", got, err)
	}
	want := "availability-zone=eu-west-1a tag:kubernetes.io/cluster/prod=owned tag-key=k8s.io/etcd/events tag-key=k8s.io/role/control-plane tag:team=infra"
	if f.filters[0] != want {
		t.Errorf("filters = %q, want %q", f.filters[0], want)
	}
	if !slices.Equal(f.attaches, []string{"vol-0bev " + me + " /dev/xvdu"}) {
		t.Errorf("attaches = %q", f.attaches)
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
			dev := newFakeDev(t)
			vols := etcdVolumes()
			xvdu := filepath.Join(dev.devs, "xvdu")
			vols[1].attachedTo(me, xvdu) // member b's volume, attached by an earlier run
			want := filepath.Join(dev.devs, "nvme2n1")
			if link != "" {
				dev.link(link, "nvme2n1")
			} else {
				want = dev.link("unrelated", "xvdu")
			}
			f := &fakeEC2{t: t, dev: dev, vols: vols}
			finder := AWS{Client: newEC2(t, f), InstanceID: me, AZ: testAZ, Cluster: "prod", Member: "b",
				DevDir: dev.byID, Timeout: 5 * time.Second, Poll: 10 * time.Millisecond, Log: quiet}
			got, err := finder.Find(context.Background())
			if err != nil || got != want {
				t.Fatalf("Find = %q, %v; want %q", got, err, want)
			}
			if len(f.attaches) != 0 {
				t.Errorf("attached again: %q", f.attaches)
			}
		})
	}
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// TestFakeEC2ChecksSignatures: the fake refuses a request signed with another secret,
// so the other tests prove the SDK client signs as AWS expects.
func TestFakeEC2ChecksSignatures(t *testing.T) {
	var (
		mu  sync.Mutex
		got error
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		got = verifySigV4(r, body)
		mu.Unlock()
		ec2Error(w, http.StatusUnauthorized, "AuthFailure", "no")
	}))
	defer srv.Close()
	client := ec2.New(ec2.Options{
		Region:       testRegion,
		Credentials:  credentials.NewStaticCredentialsProvider(testAKID, "wrong-secret", ""),
		BaseEndpoint: aws.String(srv.URL),
		HTTPClient:   srv.Client(),
	})
	_, err := AWS{Client: client, InstanceID: me, AZ: testAZ, Member: "b"}.Find(context.Background())
	mu.Lock()
	defer mu.Unlock()
	if got == nil || !strings.Contains(got.Error(), "signature does not match") {
		t.Errorf("verifySigV4 of a wrongly signed request = %v", got)
	}
	if err == nil || !strings.Contains(err.Error(), "AuthFailure") {
		t.Errorf("Find = %v; want the AuthFailure", err)
	}
}

func TestAWSBadConfig(t *testing.T) {
	for _, a := range []AWS{{}, {Client: &ec2.Client{}}, {Client: &ec2.Client{}, InstanceID: me, AZ: testAZ}} {
		if _, err := a.Find(context.Background()); err == nil || !strings.Contains(err.Error(), "aws volume: ") {
			t.Errorf("Find(%+v) = %v; want a configuration error", a, err)
		}
	}
}
