package qemutests

import (
	"bytes"
	"encoding/xml"
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

// fakeEC2 answers the EC2 Query API (form-encoded POST, XML answers) for DescribeVolumes
// and AttachVolume as EC2 does, for requests signed with the instance role's credentials
// in its region. AttachVolume puts the volume in state attaching and calls attach (the
// hotplug of the volume's disk into the instance); the attachment is attached once that
// returns.
type fakeEC2 struct {
	creds  roleCreds
	region string
	vols   []*ec2Volume
	attach func(vol *ec2Volume, device string) error

	mu      sync.Mutex
	refused []string // requests refused, with the reason
	calls   []string // "Action" of every accepted request
}

type ec2Volume struct {
	id, az, state string
	sizeGiB       int
	tags          map[string]string
	instance      string // attached to, with device
	device        string
	attachState   string // attaching, attached
	attachErr     error
}

const ec2NS = "http://ec2.amazonaws.com/doc/2016-11-15/"

func (f *fakeEC2) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	region, err := checkSigV4(r, body, f.creds, "ec2")
	if err == nil && region != f.region {
		err = fmt.Errorf("signed for region %s, the endpoint is in %s", region, f.region)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if err != nil {
		f.refused = append(f.refused, err.Error())
		ec2Error(w, http.StatusUnauthorized, "AuthFailure", "AWS was not able to validate the provided access credentials")
		return
	}
	form, err := url.ParseQuery(string(body))
	if ct := r.Header.Get("Content-Type"); r.Method != http.MethodPost || !strings.HasPrefix(ct, "application/x-www-form-urlencoded") || err != nil {
		f.refused = append(f.refused, fmt.Sprintf("%s %s with Content-Type %q", r.Method, r.URL.Path, ct))
		ec2Error(w, http.StatusBadRequest, "InvalidParameterValue", "the request must be a form POST")
		return
	}
	if form.Get("Version") != "2016-11-15" {
		ec2Error(w, http.StatusBadRequest, "InvalidParameterValue", "unsupported Version "+form.Get("Version"))
		return
	}
	f.calls = append(f.calls, form.Get("Action"))
	switch form.Get("Action") {
	case "DescribeVolumes":
		f.describeVolumes(w, form)
	case "AttachVolume":
		f.attachVolume(w, form)
	default:
		ec2Error(w, http.StatusBadRequest, "InvalidAction", "The action "+form.Get("Action")+" is not valid for this web service.")
	}
}

// listParam returns the values of prefix.1, prefix.2, … (the Query API's lists).
func listParam(form url.Values, prefix string) []string {
	var out []string
	for i := 1; form.Has(prefix + "." + strconv.Itoa(i)); i++ {
		out = append(out, form.Get(prefix+"."+strconv.Itoa(i)))
	}
	return out
}

// matches reports whether v passes the filter name=values, or an error for a filter EC2
// does not know.
func (v *ec2Volume) matches(name string, values []string) (bool, error) {
	for _, val := range values {
		switch {
		case name == "availability-zone":
			if v.az == val {
				return true, nil
			}
		case name == "tag-key":
			if _, ok := v.tags[val]; ok {
				return true, nil
			}
		case strings.HasPrefix(name, "tag:"):
			if tv, ok := v.tags[strings.TrimPrefix(name, "tag:")]; ok && tv == val {
				return true, nil
			}
		case name == "attachment.instance-id":
			if v.instance == val {
				return true, nil
			}
		default:
			return false, fmt.Errorf("The filter '%s' is invalid", name)
		}
	}
	return false, nil
}

func (f *fakeEC2) describeVolumes(w http.ResponseWriter, form url.Values) {
	ids := listParam(form, "VolumeId")
	var b bytes.Buffer
	fmt.Fprintf(&b, `<?xml version="1.0" encoding="UTF-8"?><DescribeVolumesResponse xmlns="%s"><requestId>r-dv</requestId><volumeSet>`, ec2NS)
	for _, v := range f.vols {
		ok := len(ids) == 0 || slices.Contains(ids, v.id)
		for i := 1; ok && form.Has(fmt.Sprintf("Filter.%d.Name", i)); i++ {
			var err error
			ok, err = v.matches(form.Get(fmt.Sprintf("Filter.%d.Name", i)), listParam(form, fmt.Sprintf("Filter.%d.Value", i)))
			if err != nil {
				ec2Error(w, http.StatusBadRequest, "InvalidParameterValue", err.Error())
				return
			}
		}
		if !ok {
			continue
		}
		fmt.Fprintf(&b, `<item><volumeId>%s</volumeId><size>%d</size><snapshotId/><availabilityZone>%s</availabilityZone><status>%s</status><createTime>2026-01-01T00:00:00.000Z</createTime><attachmentSet>`,
			v.id, v.sizeGiB, v.az, v.state)
		if v.instance != "" {
			fmt.Fprintf(&b, `<item><volumeId>%s</volumeId><instanceId>%s</instanceId><device>%s</device><status>%s</status><attachTime>2026-01-01T00:00:00.000Z</attachTime><deleteOnTermination>false</deleteOnTermination></item>`,
				v.id, v.instance, v.device, v.attachState)
		}
		b.WriteString(`</attachmentSet><tagSet>`)
		for _, k := range slices.Sorted(maps.Keys(v.tags)) {
			fmt.Fprintf(&b, `<item><key>%s</key><value>%s</value></item>`, xmlText(k), xmlText(v.tags[k]))
		}
		b.WriteString(`</tagSet><volumeType>gp3</volumeType><iops>3000</iops><encrypted>true</encrypted><multiAttachEnabled>false</multiAttachEnabled></item>`)
	}
	b.WriteString(`</volumeSet></DescribeVolumesResponse>`)
	w.Header().Set("Content-Type", "text/xml;charset=UTF-8")
	w.Write(b.Bytes())
}

func (f *fakeEC2) attachVolume(w http.ResponseWriter, form url.Values) {
	id, instance, device := form.Get("VolumeId"), form.Get("InstanceId"), form.Get("Device")
	var v *ec2Volume
	for _, c := range f.vols {
		if c.id == id {
			v = c
		}
	}
	switch {
	case id == "" || instance == "" || device == "":
		ec2Error(w, http.StatusBadRequest, "MissingParameter", "The request must contain the parameters VolumeId, InstanceId and Device")
		return
	case v == nil:
		ec2Error(w, http.StatusBadRequest, "InvalidVolume.NotFound", "The volume '"+id+"' does not exist.")
		return
	case v.state != "available":
		ec2Error(w, http.StatusBadRequest, "VolumeInUse", "vol '"+id+"' is already attached to an instance")
		return
	}
	v.state, v.instance, v.device, v.attachState = "in-use", instance, device, "attaching"
	go func() {
		err := f.attach(v, device)
		f.mu.Lock()
		defer f.mu.Unlock()
		if v.attachErr = err; err == nil {
			v.attachState = "attached"
		}
	}()
	w.Header().Set("Content-Type", "text/xml;charset=UTF-8")
	fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?><AttachVolumeResponse xmlns="%s"><requestId>r-av</requestId><volumeId>%s</volumeId><instanceId>%s</instanceId><device>%s</device><status>attaching</status><attachTime>2026-01-01T00:00:00.000Z</attachTime></AttachVolumeResponse>`,
		ec2NS, id, instance, device)
}

func ec2Error(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "text/xml;charset=UTF-8")
	w.WriteHeader(status)
	fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?><Response><Errors><Error><Code>%s</Code><Message>%s</Message></Error></Errors><RequestID>r-err</RequestID></Response>`, code, xmlText(msg))
}

func xmlText(s string) string {
	var b bytes.Buffer
	xml.EscapeText(&b, []byte(s))
	return b.String()
}
