package publishtest

import (
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
)

// ec2 answers an EC2 Query API call.
func (f *AWS) ec2(w http.ResponseWriter, reg *regionState, region, op string, form url.Values) {
	switch op {
	case "DescribeSnapshots":
		f.describeSnapshots(w, reg, form)
	case "DescribeImages":
		f.describeImages(w, reg, form)
	case "RegisterImage":
		f.registerImage(w, reg, form)
	case "CopyImage":
		f.copyImage(w, reg, form)
	case "DeleteSnapshot":
		id := form.Get("SnapshotId")
		switch {
		case reg.snapshots[id] == nil:
			ec2Error(w, 400, "InvalidSnapshot.NotFound", fmt.Sprintf("The snapshot '%s' does not exist.", id))
		case reg.usedBy(id) != "":
			ec2Error(w, 400, "InvalidSnapshot.InUse", fmt.Sprintf("The snapshot %s is currently in use by %s", id, reg.usedBy(id)))
		default:
			delete(reg.snapshots, id)
			ec2OK(w, op, "<return>true</return>")
		}
	case "DeregisterImage":
		id := form.Get("ImageId")
		if reg.images[id] == nil {
			ec2Error(w, 400, "InvalidAMIID.NotFound", fmt.Sprintf("The image id '[%s]' does not exist", id))
			return
		}
		delete(reg.images, id)
		ec2OK(w, op, "<return>true</return>")
	case "ModifyImageAttribute":
		img := reg.images[form.Get("ImageId")]
		if img == nil {
			ec2Error(w, 400, "InvalidAMIID.NotFound", "The image id does not exist")
			return
		}
		for i := 1; form.Has(fmt.Sprintf("LaunchPermission.Add.%d.UserId", i)); i++ {
			img.LaunchPermission = addUnique(img.LaunchPermission, form.Get(fmt.Sprintf("LaunchPermission.Add.%d.UserId", i)))
		}
		ec2OK(w, op, "<return>true</return>")
	case "ModifySnapshotAttribute":
		s := reg.snapshots[form.Get("SnapshotId")]
		if s == nil || form.Get("Attribute") != "createVolumePermission" || form.Get("OperationType") != "add" {
			ec2Error(w, 400, "InvalidParameterValue", "bad ModifySnapshotAttribute")
			return
		}
		for _, u := range indexed(form, "UserId") {
			s.VolumePermission = addUnique(s.VolumePermission, u)
		}
		ec2OK(w, op, "<return>true</return>")
	default:
		f.t.Errorf("unexpected EC2 action %q", op)
		ec2Error(w, 400, "InvalidAction", "The action "+op+" is not valid for this web service.")
	}
}

func addUnique(list []string, v string) []string {
	if slices.Contains(list, v) {
		return list
	}
	return append(list, v)
}

func ec2OK(w http.ResponseWriter, op, inner string) {
	w.Header().Set("Content-Type", "text/xml;charset=UTF-8")
	fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?>
<%sResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/"><requestId>req-1</requestId>%s</%sResponse>`, op, inner, op)
}

// usedBy is the image whose root device is the snapshot id, or "".
func (r *regionState) usedBy(id string) string {
	for _, img := range r.images {
		if img.SnapshotID == id {
			return img.ID
		}
	}
	return ""
}

type filter struct {
	key    string
	values []string
}

func filtersOf(form url.Values) []filter {
	var fs []filter
	for i := 1; form.Has(fmt.Sprintf("Filter.%d.Name", i)); i++ {
		fs = append(fs, filter{form.Get(fmt.Sprintf("Filter.%d.Name", i)), indexed(form, fmt.Sprintf("Filter.%d.Value", i))})
	}
	return fs
}

// match applies filters to a resource with tags and the named fields; an unknown filter
// is an error, as EC2's.
func match(fs []filter, tags map[string]string, fields map[string]string) (bool, error) {
	for _, fl := range fs {
		var got string
		var has bool
		if k, ok := strings.CutPrefix(fl.key, "tag:"); ok {
			got, has = tags[k]
		} else if got, has = fields[fl.key]; !has {
			return false, fmt.Errorf("The filter '%s' is invalid", fl.key)
		}
		if !has || !slices.Contains(fl.values, got) {
			return false, nil
		}
	}
	return true, nil
}

func tagSet(tags map[string]string) string {
	var b strings.Builder
	b.WriteString("<tagSet>")
	for _, k := range sortedKeys(tags) {
		fmt.Fprintf(&b, "<item><key>%s</key><value>%s</value></item>", xmlEscape(k), xmlEscape(tags[k]))
	}
	b.WriteString("</tagSet>")
	return b.String()
}

// ownerWanted says whether a resource of owner o is listed to a Describe call asking for the
// owners (self is the caller's account; none: any).
func (f *AWS) ownerWanted(o string, owners []string) bool {
	if f.anyOwner || len(owners) == 0 {
		return true
	}
	return slices.Contains(owners, o) || o == AWSAccount && slices.Contains(owners, "self")
}

func (f *AWS) describeSnapshots(w http.ResponseWriter, reg *regionState, form url.Values) {
	ids := indexed(form, "SnapshotId")
	owners := indexed(form, "Owner")
	for _, id := range ids {
		if reg.snapshots[id] == nil {
			ec2Error(w, 400, "InvalidSnapshot.NotFound", fmt.Sprintf("The snapshot '%s' does not exist.", id))
			return
		}
	}
	var b strings.Builder
	b.WriteString("<snapshotSet>")
	for _, id := range slices.Sorted(maps.Keys(reg.snapshots)) {
		s := reg.snapshots[id]
		if len(ids) > 0 && !slices.Contains(ids, id) || !f.ownerWanted(owner(s.Owner), owners) {
			continue
		}
		if s.State == "completing" {
			if s.looks++; s.looks > f.pending {
				s.State = "completed"
			}
		}
		state := s.State
		if state == "completing" {
			state = "pending"
		}
		ok, err := match(filtersOf(form), s.Tags, map[string]string{"status": state, "snapshot-id": id})
		if err != nil {
			ec2Error(w, 400, "InvalidParameterValue", err.Error())
			return
		}
		if ok {
			fmt.Fprintf(&b, `<item><snapshotId>%s</snapshotId><volumeId>vol-ffffffff</volumeId><status>%s</status><startTime>2026-01-01T00:00:00.000Z</startTime><progress>%s</progress><ownerId>%s</ownerId><volumeSize>%d</volumeSize><description>%s</description><encrypted>false</encrypted>%s<storageTier>standard</storageTier></item>`,
				id, state, map[bool]string{true: "100%", false: "0%"}[state == "completed"], owner(s.Owner), s.GiB, xmlEscape(s.Description), tagSet(s.Tags))
		}
	}
	b.WriteString("</snapshotSet>")
	ec2OK(w, "DescribeSnapshots", b.String())
}

func (f *AWS) describeImages(w http.ResponseWriter, reg *regionState, form url.Values) {
	ids := indexed(form, "ImageId")
	for _, id := range ids {
		if reg.images[id] == nil {
			ec2Error(w, 400, "InvalidAMIID.NotFound", fmt.Sprintf("The image id '[%s]' does not exist", id))
			return
		}
	}
	owners := indexed(form, "Owner")
	if len(ids) == 0 && !slices.Equal(owners, []string{"self"}) {
		f.t.Errorf("DescribeImages by name or tag without Owner self: would list public images too")
	}
	var b strings.Builder
	b.WriteString("<imagesSet>")
	for _, id := range slices.Sorted(maps.Keys(reg.images)) {
		img := reg.images[id]
		if len(ids) > 0 && !slices.Contains(ids, id) || !f.ownerWanted(owner(img.Owner), owners) {
			continue
		}
		if img.State == "pending" {
			if img.looks++; img.looks > f.pending {
				img.State = "available"
			}
		}
		ok, err := match(filtersOf(form), img.Tags, map[string]string{"name": img.Name, "state": img.State, "image-id": id})
		if err != nil {
			ec2Error(w, 400, "InvalidParameterValue", err.Error())
			return
		}
		if ok {
			b.WriteString(imageItem(img))
		}
	}
	b.WriteString("</imagesSet>")
	ec2OK(w, "DescribeImages", b.String())
}

// imageItem is img as DescribeImages describes it; a copy names its source.
func imageItem(img *Image) string {
	var source string
	if img.Params.Get("Action") == "CopyImage" {
		source = fmt.Sprintf("<sourceImageId>%s</sourceImageId><sourceImageRegion>%s</sourceImageRegion>", xmlEscape(img.Params.Get("SourceImageId")), xmlEscape(img.Params.Get("SourceRegion")))
	}
	o := owner(img.Owner)
	return fmt.Sprintf(`<item><imageId>%s</imageId><imageLocation>%s/%s</imageLocation><imageState>%s</imageState><imageOwnerId>%s</imageOwnerId><creationDate>2026-01-01T00:00:00.000Z</creationDate><isPublic>false</isPublic><architecture>%s</architecture><imageType>machine</imageType><name>%s</name><rootDeviceType>ebs</rootDeviceType><rootDeviceName>/dev/xvda</rootDeviceName><blockDeviceMapping><item><deviceName>/dev/xvda</deviceName><ebs><snapshotId>%s</snapshotId><volumeSize>%d</volumeSize><deleteOnTermination>true</deleteOnTermination><volumeType>gp3</volumeType><encrypted>false</encrypted></ebs></item></blockDeviceMapping><virtualizationType>hvm</virtualizationType>%s<hypervisor>xen</hypervisor><enaSupport>true</enaSupport><bootMode>%s</bootMode><imdsSupport>%s</imdsSupport>%s</item>`,
		img.ID, o, xmlEscape(img.Name), img.State, o, xmlEscape(img.Attrs["Architecture"]), xmlEscape(img.Name), img.SnapshotID, img.GiB, tagSet(img.Tags),
		xmlEscape(img.Attrs["BootMode"]), xmlEscape(img.Attrs["ImdsSupport"]), source)
}

// registerImage checks a RegisterImage of an EBS-backed AMI as EC2 does.
func (f *AWS) registerImage(w http.ResponseWriter, reg *regionState, form url.Values) {
	name, snap := form.Get("Name"), form.Get("BlockDeviceMapping.1.Ebs.SnapshotId")
	size, _ := strconv.ParseInt(form.Get("BlockDeviceMapping.1.Ebs.VolumeSize"), 10, 64)
	s := reg.snapshots[snap]
	for i := 1; form.Has(fmt.Sprintf("TagSpecification.%d.ResourceType", i)); i++ {
		if rt := form.Get(fmt.Sprintf("TagSpecification.%d.ResourceType", i)); rt != "image" {
			ec2Error(w, 400, "InvalidParameterValue", "'"+rt+"' is not a valid taggable resource type for this operation.")
			return
		}
	}
	switch {
	case reg.named(name) != nil:
		ec2Error(w, 400, "InvalidAMIName.Duplicate", fmt.Sprintf("AMI name %s is already in use by AMI %s", name, reg.named(name).ID))
	case s == nil:
		ec2Error(w, 400, "InvalidSnapshot.NotFound", fmt.Sprintf("The snapshot '%s' does not exist.", snap))
	case s.State != "completed":
		ec2Error(w, 400, "IncorrectState", fmt.Sprintf("Snapshot %s is not completed", snap))
	case size < s.GiB:
		ec2Error(w, 400, "InvalidBlockDeviceMapping", "Volume of size "+strconv.FormatInt(size, 10)+"GB is smaller than snapshot")
	case form.Get("RootDeviceName") != form.Get("BlockDeviceMapping.1.DeviceName"):
		ec2Error(w, 400, "InvalidBlockDeviceMapping", "The root device is not in the block device mapping")
	default:
		img := &Image{ID: f.newID("ami"), Name: name, State: "pending", SnapshotID: snap, GiB: size, Tags: tagsOf(form, "image"), Params: form,
			Attrs: map[string]string{"BootMode": form.Get("BootMode"), "ImdsSupport": form.Get("ImdsSupport"), "Architecture": form.Get("Architecture")}}
		reg.images[img.ID] = img
		ec2OK(w, "RegisterImage", "<imageId>"+img.ID+"</imageId>")
	}
}

// named is the account's image called name (names are unique per account and region).
func (r *regionState) named(name string) *Image {
	for _, img := range r.images {
		if img.Name == name && owner(img.Owner) == AWSAccount {
			return img
		}
	}
	return nil
}

// copyImage copies an available image of another region into reg, with a new snapshot. A
// request repeating the ClientToken of an earlier one gets the image that one made.
func (f *AWS) copyImage(w http.ResponseWriter, reg *regionState, form url.Values) {
	src := f.region(form.Get("SourceRegion")).images[form.Get("SourceImageId")]
	name, token := form.Get("Name"), form.Get("ClientToken")
	if id, ok := f.tokens[token]; ok && token != "" {
		if prev := reg.images[id]; prev == nil || prev.Params.Get("SourceImageId") != form.Get("SourceImageId") || prev.Name != name {
			ec2Error(w, 400, "IdempotentParameterMismatch", "The client token "+token+" was used with other parameters")
			return
		}
		ec2OK(w, "CopyImage", "<imageId>"+id+"</imageId>")
		return
	}
	switch {
	case src == nil:
		ec2Error(w, 400, "InvalidAMIID.NotFound", "The image id '["+form.Get("SourceImageId")+"]' does not exist")
	case src.State != "available":
		ec2Error(w, 400, "IncorrectState", "Image is not available")
	case reg.named(name) != nil:
		ec2Error(w, 400, "InvalidAMIName.Duplicate", "AMI name "+name+" is already in use")
	default:
		orig := f.region(form.Get("SourceRegion")).snapshots[src.SnapshotID]
		s := &Snapshot{ID: f.newID("snap"), State: "completed", GiB: orig.GiB, Tags: tagsOf(form, "snapshot"), Blocks: orig.Blocks, digests: orig.digests}
		reg.snapshots[s.ID] = s
		img := &Image{ID: f.newID("ami"), Name: name, State: "pending", SnapshotID: s.ID, GiB: src.GiB, Tags: tagsOf(form, "image"), Params: form, Attrs: maps.Clone(src.Attrs)}
		reg.images[img.ID] = img
		if token != "" {
			f.tokens[token] = img.ID
		}
		ec2OK(w, "CopyImage", "<imageId>"+img.ID+"</imageId>")
	}
}
