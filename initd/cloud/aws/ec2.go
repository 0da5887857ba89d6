package aws

import (
	"context"
	"encoding/xml"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
)

// The EC2 Query API (form-encoded POSTs, XML answers), of the calls the EBS finder makes:
// DescribeVolumes and AttachVolume.

// ec2APIVersion is the EC2 API version the requests are made in.
const ec2APIVersion = "2016-11-15"

// Volume is an EBS volume as DescribeVolumes describes it.
type Volume struct {
	ID string `xml:"volumeId"`
	AZ string `xml:"availabilityZone"`
	// State is creating, available, in-use, deleting, deleted or error.
	State       string             `xml:"status"`
	Attachments []VolumeAttachment `xml:"attachmentSet>item"`
	Tags        []Tag              `xml:"tagSet>item"`
}

// VolumeAttachment is a volume's attachment to an instance.
type VolumeAttachment struct {
	InstanceID string `xml:"instanceId"`
	Device     string `xml:"device"`
	// State is attaching, attached, detaching or detached.
	State string `xml:"status"`
}

// The attachment and volume states the EBS finder tells apart.
const (
	volumeAvailable     = "available"
	attachmentAttached  = "attached"
	attachmentDetaching = "detaching"
	attachmentDetached  = "detached"
)

// Tag is a resource tag.
type Tag struct {
	Key   string `xml:"key"`
	Value string `xml:"value"`
}

// Filter is a DescribeVolumes filter: a volume passes when it matches one of Values.
type Filter struct {
	Name   string
	Values []string
}

// EC2Client calls the EC2 API of a region.
type EC2Client struct {
	api *apiClient
}

// newEC2Client returns a client of the EC2 API at endpoint, signing for region with creds.
func newEC2Client(endpoint, region string, creds credentialSource) (*EC2Client, error) {
	api, err := newAPIClient("EC2", "ec2", region, endpoint, creds, decodeEC2Error)
	if err != nil {
		return nil, err
	}
	return &EC2Client{api: api}, nil
}

// call sends action with params and decodes the answer into out.
func (c *EC2Client) call(ctx context.Context, action string, params url.Values, out any) error {
	params.Set("Action", action)
	params.Set("Version", ec2APIVersion)
	body, err := c.api.do(ctx, apiRequest{op: action, method: http.MethodPost, path: "/",
		contentType: "application/x-www-form-urlencoded", body: []byte(params.Encode())})
	if err != nil {
		return err
	}
	if err := xml.Unmarshal(body, out); err != nil {
		return fmt.Errorf("EC2 %s: decode answer: %w", action, err)
	}
	return nil
}

// DescribeVolumes returns the volumes among ids (all when none) that pass every filter,
// reading every page of the answer.
func (c *EC2Client) DescribeVolumes(ctx context.Context, ids []string, filters []Filter) ([]Volume, error) {
	params := url.Values{}
	for i, id := range ids {
		params.Set("VolumeId."+strconv.Itoa(i+1), id)
	}
	for i, f := range filters {
		prefix := "Filter." + strconv.Itoa(i+1)
		params.Set(prefix+".Name", f.Name)
		for j, v := range f.Values {
			params.Set(prefix+".Value."+strconv.Itoa(j+1), v)
		}
	}
	var vols []Volume
	for {
		var out struct {
			Volumes   []Volume `xml:"volumeSet>item"`
			NextToken string   `xml:"nextToken"`
		}
		if err := c.call(ctx, "DescribeVolumes", params, &out); err != nil {
			return nil, err
		}
		vols = append(vols, out.Volumes...)
		switch out.NextToken {
		case "":
			return vols, nil
		case params.Get("NextToken"):
			return nil, fmt.Errorf("EC2 DescribeVolumes: the next page's token is the page's own")
		}
		params.Set("NextToken", out.NextToken)
	}
}

// AttachVolume attaches volume id to instance as device.
func (c *EC2Client) AttachVolume(ctx context.Context, id, instance, device string) error {
	var out struct {
		State string `xml:"status"`
	}
	return c.call(ctx, "AttachVolume", url.Values{"VolumeId": {id}, "InstanceId": {instance}, "Device": {device}}, &out)
}

// decodeEC2Error reads EC2's error answer:
// <Response><Errors><Error><Code>…</Code><Message>…</Message></Error></Errors><RequestID>…
func decodeEC2Error(body []byte, e *APIError) {
	var doc struct {
		Errors []struct {
			Code    string `xml:"Code"`
			Message string `xml:"Message"`
		} `xml:"Errors>Error"`
		RequestID    string `xml:"RequestID"`
		RequestIDAlt string `xml:"RequestId"`
	}
	if xml.Unmarshal(body, &doc) != nil || len(doc.Errors) == 0 {
		return
	}
	e.Code, e.Message = doc.Errors[0].Code, doc.Errors[0].Message
	e.RequestID = doc.RequestID
	if e.RequestID == "" {
		e.RequestID = doc.RequestIDAlt
	}
}
