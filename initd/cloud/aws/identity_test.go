package aws

import (
	"context"
	"strings"
	"testing"

	"github.com/kilnproject/kiln/initd/config"
	"github.com/kilnproject/kiln/internal/cloudfake"
)

// ec2Instance is the EC2 instance the tests run on.
func ec2Instance() *cloudfake.IMDS {
	return &cloudfake.IMDS{InstanceID: "i-0123456789abcdef0", AZ: "eu-west-1b", Hostname: "ip-10-0-1-5.eu-west-1.compute.internal"}
}

// TestIdentify: the instance's identity from IMDSv2, the hostname without EC2's domain.
func TestIdentify(t *testing.T) {
	srv := cloudfake.Serve(t, ec2Instance())
	in, err := readInstance(context.Background(), srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	if in.Cloud != "aws" || in.InstanceID != "i-0123456789abcdef0" || in.Zone != "eu-west-1b" || in.Hostname != "ip-10-0-1-5" {
		t.Errorf("instance = %+v", in)
	}
	// No local-hostname (resource-name hostnames, IPv6-only subnets): no platform hostname.
	noName := cloudfake.Serve(t, &cloudfake.IMDS{InstanceID: "i-1", AZ: "eu-west-1b"})
	if in, err := readInstance(context.Background(), noName.URL); err != nil || in.Hostname != "" || in.InstanceID != "i-1" {
		t.Errorf("without local-hostname: %+v, %v", in, err)
	}
	noZone := cloudfake.Serve(t, &cloudfake.IMDS{InstanceID: "i-1"})
	if _, err := readInstance(context.Background(), noZone.URL); err == nil || !strings.Contains(err.Error(), "placement/availability-zone") {
		t.Errorf("without a zone: %v", err)
	}
}

// TestIdentifyEndpoint: Identify asks the IMDS of node.yaml's aws.endpoints.imds.
func TestIdentifyEndpoint(t *testing.T) {
	srv := cloudfake.Serve(t, ec2Instance())
	n := &config.Node{}
	n.AWS.Endpoints.IMDS = srv.URL
	if in, err := (Cloud{}).Identify(context.Background(), n); err != nil || in.InstanceID != "i-0123456789abcdef0" {
		t.Errorf("Identify = %+v, %v", in, err)
	}
}
