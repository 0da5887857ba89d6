package cloudfake

import (
	"bytes"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// EC2 is a fake of the EC2 Query API (form-encoded POST, XML answers) for DescribeVolumes
// and AttachVolume, as EC2 answers them. It accepts requests signed (SigV4) with Creds for
// ec2 in Region, of API version 2016-11-15, and refuses others with AuthFailure,
// NoSuchVersion or InvalidAction; a filter the fake does not implement (every filter EC2
// does not know among them) with InvalidParameterValue, an AttachVolume without its
// parameters with MissingParameter.
//
// AttachVolume checks what EC2 checks (the volume and instance exist, the volume is
// available and in the instance's zone, the device name is free on the instance), then
// answers attaching and runs Attach; the attachment is reported attached once Attach has
// returned and SettleLooks DescribeVolumes answers have shown it attaching.
type EC2 struct {
	// Creds are the credentials requests must be signed with, Region the region they must
	// be signed for.
	Creds  AWSCredentials
	Region string
	// Instances are the instances of the region, by id, with their availability zone.
	Instances map[string]string
	// Volumes are the region's volumes, in the order DescribeVolumes lists them.
	Volumes []*EC2Volume
	// SettleLooks is how many DescribeVolumes answers show a new attachment as attaching
	// before it is attached: EC2 takes seconds to attach a volume, and a client must wait.
	SettleLooks int
	// BeforeAttach, when set, runs in AttachVolume on the volume it names, before the fake
	// looks at the volume: the place for another instance to win the race for it.
	BeforeAttach func(v *EC2Volume)
	// Attach, when set, plugs volume id into its instance as device (a QEMU hotplug, or the
	// device link udev would make). It runs in its own goroutine once AttachVolume has
	// answered, without the lock; an error is kept in the attachment's Err and leaves it
	// attaching.
	Attach func(id, device string) error

	// Mutex guards the fake's state: a test holds it to read or change Volumes while the
	// fake serves.
	sync.Mutex
	calls   []EC2Call
	refused []string
}

// EC2Volume is an EBS volume of the EC2 fake.
type EC2Volume struct {
	ID, AZ string
	// State is the volume's state: available, in-use, creating, ….
	State string
	// SizeGiB is the volume's size; 0 answers 8.
	SizeGiB int
	Tags    map[string]string
	// Attachments are the volume's attachments; AttachVolume makes one.
	Attachments []EC2Attachment
}

// EC2Attachment is a volume's attachment to an instance.
type EC2Attachment struct {
	Instance, Device string
	// State is attaching, attached, detaching or detached.
	State string
	// Err is what Attach returned, when it failed.
	Err error

	looks    int  // DescribeVolumes answers that showed it attaching
	plugging bool // Attach is under way
}

// EC2Call is a request the EC2 fake took.
type EC2Call struct {
	Action string
	// VolumeIDs are the volumes the request names (DescribeVolumes' VolumeId.N,
	// AttachVolume's VolumeId).
	VolumeIDs []string
	// Filters are DescribeVolumes' filters in the request's order, each as
	// "name=value,value".
	Filters []string
	// Instance and Device are AttachVolume's.
	Instance, Device string
}

const ec2NS = "http://ec2.amazonaws.com/doc/2016-11-15/"

// Calls returns the requests the fake took, in order.
func (f *EC2) Calls() []EC2Call {
	f.Lock()
	defer f.Unlock()
	return slices.Clone(f.calls)
}

// Refused returns the requests the fake refused, each with the reason.
func (f *EC2) Refused() []string {
	f.Lock()
	defer f.Unlock()
	return slices.Clone(f.refused)
}

// ServeHTTP implements http.Handler.
func (f *EC2) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	f.Lock()
	defer f.Unlock()
	refuse := func(status int, code, msg, why string) {
		f.refused = append(f.refused, refusal(r, why))
		ec2Error(w, status, code, msg)
	}
	if err != nil {
		refuse(http.StatusBadRequest, "InvalidRequest", "The request body could not be read.", "read body: "+err.Error())
		return
	}
	if err := checkAWS(r, body, f.Creds, "ec2", f.Region); err != nil {
		refuse(http.StatusUnauthorized, "AuthFailure", "AWS was not able to validate the provided access credentials", err.Error())
		return
	}
	form, err := url.ParseQuery(string(body))
	if ct := r.Header.Get("Content-Type"); r.Method != http.MethodPost || !strings.HasPrefix(ct, "application/x-www-form-urlencoded") || err != nil {
		refuse(http.StatusBadRequest, "InvalidParameterValue", "The request must be a form-encoded POST.",
			fmt.Sprintf("Content-Type %q, body %v; EC2 takes a form POST", ct, err))
		return
	}
	if v := form.Get("Version"); v != "2016-11-15" {
		refuse(http.StatusBadRequest, "NoSuchVersion", "The requested version ("+v+") of service AmazonEC2 does not exist",
			"API version "+strconv.Quote(v))
		return
	}
	switch a := form.Get("Action"); a {
	case "DescribeVolumes":
		filters, err := ec2Filters(form)
		if err != nil {
			refuse(http.StatusBadRequest, "InvalidParameterValue", err.Error(), err.Error())
			return
		}
		f.calls = append(f.calls, EC2Call{Action: a, VolumeIDs: queryList(form, "VolumeId"), Filters: describeFilters(filters)})
		f.describeVolumes(w, queryList(form, "VolumeId"), filters)
	case "AttachVolume":
		id, instance, device := form.Get("VolumeId"), form.Get("InstanceId"), form.Get("Device")
		if id == "" || instance == "" || device == "" {
			refuse(http.StatusBadRequest, "MissingParameter", "The request must contain the parameters VolumeId, InstanceId and Device",
				"AttachVolume without VolumeId, InstanceId or Device")
			return
		}
		f.calls = append(f.calls, EC2Call{Action: a, VolumeIDs: []string{id}, Instance: instance, Device: device})
		f.attachVolume(w, id, instance, device)
	default:
		refuse(http.StatusBadRequest, "InvalidAction", "The action "+a+" is not valid for this web service.", "action "+strconv.Quote(a))
	}
}

// ec2Filter is a DescribeVolumes filter: a volume passes when it matches one of the values.
type ec2Filter struct {
	name   string
	values []string
}

// queryList returns the values of prefix.1, prefix.2, … (the Query API's lists).
func queryList(form url.Values, prefix string) []string {
	var out []string
	for i := 1; form.Has(prefix + "." + strconv.Itoa(i)); i++ {
		out = append(out, form.Get(prefix+"."+strconv.Itoa(i)))
	}
	return out
}

// ec2Filters returns the request's filters, or an error for one EC2 does not know for
// volumes or one without values.
func ec2Filters(form url.Values) ([]ec2Filter, error) {
	var out []ec2Filter
	for i := 1; form.Has(fmt.Sprintf("Filter.%d.Name", i)); i++ {
		fl := ec2Filter{form.Get(fmt.Sprintf("Filter.%d.Name", i)), queryList(form, fmt.Sprintf("Filter.%d.Value", i))}
		switch {
		case fl.name == "availability-zone", fl.name == "tag-key", fl.name == "attachment.instance-id",
			strings.HasPrefix(fl.name, "tag:") && len(fl.name) > len("tag:"):
		default:
			return nil, fmt.Errorf("The filter '%s' is invalid", fl.name)
		}
		if len(fl.values) == 0 {
			return nil, fmt.Errorf("The filter '%s' has no values", fl.name)
		}
		out = append(out, fl)
	}
	return out, nil
}

func describeFilters(filters []ec2Filter) []string {
	var out []string
	for _, fl := range filters {
		out = append(out, fl.name+"="+strings.Join(fl.values, ","))
	}
	return out
}

// matches reports whether v passes fl.
func (v *EC2Volume) matches(fl ec2Filter) bool {
	for _, val := range fl.values {
		switch {
		case fl.name == "availability-zone":
			if v.AZ == val {
				return true
			}
		case fl.name == "tag-key":
			if _, ok := v.Tags[val]; ok {
				return true
			}
		case fl.name == "attachment.instance-id":
			for _, a := range v.Attachments {
				if a.Instance == val {
					return true
				}
			}
		default: // tag:KEY
			if tv, ok := v.Tags[strings.TrimPrefix(fl.name, "tag:")]; ok && tv == val {
				return true
			}
		}
	}
	return false
}

// settle takes one DescribeVolumes answer's look at attachment a: an attachment that is
// attaching turns attached once Attach is done and SettleLooks answers have shown it.
func (f *EC2) settle(a *EC2Attachment) {
	if a.State != "attaching" {
		return
	}
	if !a.plugging && a.Err == nil && a.looks >= f.SettleLooks {
		a.State = "attached"
		return
	}
	a.looks++
}

func (f *EC2) describeVolumes(w http.ResponseWriter, ids []string, filters []ec2Filter) {
	var b bytes.Buffer
	fmt.Fprintf(&b, `<?xml version="1.0" encoding="UTF-8"?><DescribeVolumesResponse xmlns="%s"><requestId>r-dv</requestId><volumeSet>`, ec2NS)
	for _, v := range f.Volumes {
		ok := len(ids) == 0 || slices.Contains(ids, v.ID)
		for _, fl := range filters {
			ok = ok && v.matches(fl)
		}
		if !ok {
			continue
		}
		size := v.SizeGiB
		if size == 0 {
			size = 8
		}
		fmt.Fprintf(&b, `<item><volumeId>%s</volumeId><size>%d</size><snapshotId/><availabilityZone>%s</availabilityZone><status>%s</status><createTime>2026-01-01T00:00:00.000Z</createTime><attachmentSet>`,
			v.ID, size, v.AZ, v.State)
		for i := range v.Attachments {
			f.settle(&v.Attachments[i])
			a := v.Attachments[i]
			fmt.Fprintf(&b, `<item><volumeId>%s</volumeId><instanceId>%s</instanceId><device>%s</device><status>%s</status><attachTime>2026-01-01T00:00:00.000Z</attachTime><deleteOnTermination>false</deleteOnTermination></item>`,
				v.ID, a.Instance, xmlText(a.Device), a.State)
		}
		b.WriteString(`</attachmentSet><tagSet>`)
		for _, k := range slices.Sorted(maps.Keys(v.Tags)) {
			fmt.Fprintf(&b, `<item><key>%s</key><value>%s</value></item>`, xmlText(k), xmlText(v.Tags[k]))
		}
		b.WriteString(`</tagSet><volumeType>gp3</volumeType><iops>3000</iops><encrypted>true</encrypted><multiAttachEnabled>false</multiAttachEnabled></item>`)
	}
	b.WriteString(`</volumeSet></DescribeVolumesResponse>`)
	w.Header().Set("Content-Type", "text/xml;charset=UTF-8")
	w.Write(b.Bytes())
}

func (f *EC2) volume(id string) *EC2Volume {
	for _, v := range f.Volumes {
		if v.ID == id {
			return v
		}
	}
	return nil
}

func (f *EC2) attachVolume(w http.ResponseWriter, id, instance, device string) {
	v := f.volume(id)
	if v != nil && f.BeforeAttach != nil {
		f.BeforeAttach(v)
	}
	az, known := f.Instances[instance]
	switch {
	case v == nil:
		ec2Error(w, http.StatusBadRequest, "InvalidVolume.NotFound", "The volume '"+id+"' does not exist.")
		return
	case !known:
		ec2Error(w, http.StatusBadRequest, "InvalidInstanceID.NotFound", "The instance ID '"+instance+"' does not exist")
		return
	case v.State == "in-use":
		ec2Error(w, http.StatusBadRequest, "VolumeInUse", id+" is already attached to an instance")
		return
	case v.State != "available":
		ec2Error(w, http.StatusBadRequest, "IncorrectState", "vol '"+id+"' is not 'available'.")
		return
	case v.AZ != az:
		ec2Error(w, http.StatusBadRequest, "InvalidVolume.ZoneMismatch",
			"The volume '"+id+"' is not in the same availability zone as instance '"+instance+"'")
		return
	}
	for _, other := range f.Volumes {
		for _, a := range other.Attachments {
			if a.Instance == instance && a.Device == device && a.State != "detached" {
				ec2Error(w, http.StatusBadRequest, "InvalidParameterValue",
					"Invalid value '"+device+"' for unixDevice. Attachment point "+device+" is already in use")
				return
			}
		}
	}
	v.State = "in-use"
	v.Attachments = []EC2Attachment{{Instance: instance, Device: device, State: "attaching", plugging: f.Attach != nil}}
	if attach := f.Attach; attach != nil {
		go f.plug(attach, v, id, instance, device)
	}
	w.Header().Set("Content-Type", "text/xml;charset=UTF-8")
	fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?><AttachVolumeResponse xmlns="%s"><requestId>r-av</requestId><volumeId>%s</volumeId><instanceId>%s</instanceId><device>%s</device><status>attaching</status><attachTime>2026-01-01T00:00:00.000Z</attachTime></AttachVolumeResponse>`,
		ec2NS, id, instance, xmlText(device))
}

// plug runs attach for v's new attachment to instance and records its outcome.
func (f *EC2) plug(attach func(id, device string) error, v *EC2Volume, id, instance, device string) {
	err := attach(id, device)
	f.Lock()
	defer f.Unlock()
	for i := range v.Attachments {
		if a := &v.Attachments[i]; a.Instance == instance && a.plugging {
			a.plugging, a.Err = false, err
			if err == nil && a.State == "attaching" && a.looks >= f.SettleLooks {
				a.State = "attached"
			}
		}
	}
}

// ec2Error answers an EC2 error as the Query API does.
func ec2Error(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "text/xml;charset=UTF-8")
	w.WriteHeader(status)
	fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?><Response><Errors><Error><Code>%s</Code><Message>%s</Message></Error></Errors><RequestID>r-err</RequestID></Response>`,
		code, xmlText(msg))
}
