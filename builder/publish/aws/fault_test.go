package aws

import (
	"context"
	"strings"
	"testing"

	"github.com/kilnproject/kiln/builder/publish"
	"github.com/kilnproject/kiln/builder/publish/publishtest"
)

// Transient failures are retried and the publish succeeds; a refused call is an error
// naming the permission, and a failed publish leaves nothing behind, or names what it left.
func TestPublishAWSFaults(t *testing.T) {
	for _, tc := range []struct {
		name   string
		faults []publishtest.Fault
		want   string // error substring; "" succeeds
		left   int    // snapshots left in the fake when the publish fails
	}{
		{name: "EBS throttling", faults: []publishtest.Fault{
			{Op: "PutSnapshotBlock", Times: 4, Status: 400, Code: "RequestThrottledException", Reason: "ACCOUNT_THROTTLED", Message: "Rate exceeded"},
			{Op: "StartSnapshot", Times: 1, Status: 400, Code: "RequestThrottledException", Reason: "ACCOUNT_THROTTLED", Message: "Rate exceeded"},
		}},
		{name: "EC2 throttling and 5xx", faults: []publishtest.Fault{
			{Op: "RegisterImage", Times: 2, Status: 503, Code: "RequestLimitExceeded", Message: "Request limit exceeded."},
			{Op: "DescribeSnapshots", Times: 1, Status: 500, Code: "InternalError", Message: "An internal error has occurred"},
		}},
		{name: "EBS internal errors", faults: []publishtest.Fault{
			{Op: "PutSnapshotBlock", After: 2, Times: 3, Status: 500, Code: "InternalServerException", Message: "internal error"},
			{Op: "CompleteSnapshot", Times: 1, Status: 503, Code: "InternalServerException", Message: "unavailable"},
		}},
		{name: "connection cut mid-upload", faults: []publishtest.Fault{{Op: "PutSnapshotBlock", After: 3, Times: 3, Cut: true}}},
		{name: "connection cut for good", faults: []publishtest.Fault{{Op: "PutSnapshotBlock", After: 3, Times: -1, Cut: true}},
			want: "PutSnapshotBlock in eu-west-1"},
		{name: "StartSnapshot denied", faults: []publishtest.Fault{{Op: "StartSnapshot", Times: -1, Status: 403, Code: "AccessDeniedException", Reason: "UNAUTHORIZED_ACCOUNT",
			Message: "User: arn:aws:iam::111122223333:user/ci is not authorized to perform: ebs:StartSnapshot"}},
			want: "StartSnapshot in eu-west-1: access denied: the credentials need the IAM permission ebs:StartSnapshot"},
		{name: "PutSnapshotBlock denied", faults: []publishtest.Fault{{Op: "PutSnapshotBlock", After: 2, Times: -1, Status: 403, Code: "AccessDeniedException", Message: "not authorized to perform: ebs:PutSnapshotBlock"}},
			want: "the credentials need the IAM permission ebs:PutSnapshotBlock"},
		{name: "RegisterImage denied", faults: []publishtest.Fault{{Op: "RegisterImage", Times: -1, Status: 403, Code: "UnauthorizedOperation", Message: "You are not authorized to perform this operation."}},
			want: "the credentials need the IAM permission ec2:RegisterImage"},
		{name: "credentials refused", faults: []publishtest.Fault{{Op: "DescribeImages", Times: -1, Status: 401, Code: "AuthFailure", Message: "AWS was not able to validate the provided access credentials"}},
			want: "DescribeImages in eu-west-1: the credentials were refused (AuthFailure: AWS was not able to validate the provided access credentials)"},
		{name: "session expired mid-upload", faults: []publishtest.Fault{{Op: "PutSnapshotBlock", After: 2, Times: -1, Status: 403, Code: "ExpiredTokenException", Message: "The security token included in the request is expired"}},
			want: "PutSnapshotBlock in eu-west-1: the credentials were refused (ExpiredTokenException"},
		{name: "denied, and the snapshot cannot be deleted", faults: []publishtest.Fault{
			{Op: "PutSnapshotBlock", Times: -1, Status: 403, Code: "AccessDeniedException", Message: "not authorized"},
			{Op: "DeleteSnapshot", Times: -1, Status: 403, Code: "UnauthorizedOperation", Message: "You are not authorized to perform this operation."},
		}, want: "left behind in eu-west-1: snapshot snap-00000000000000001", left: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, a := newFakeAWS(t, tc.faults...)
			path, content := publishtest.RawImage(t, t.TempDir(), testDiskSize, scattered())
			im, err := publish.Load(path)
			if err != nil {
				t.Fatal(err)
			}
			res, err := a.publish(context.Background(), im, newRequest())
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				checkSnapshot(t, f, testRegion, res.SnapshotID, content)
				if f.Image(testRegion, res.ImageID) == nil {
					t.Errorf("no image %s", res.ImageID)
				}
				for _, ft := range f.Unspent() {
					t.Errorf("%s failed fewer times than the fault asked (%d to go)", ft.Op, ft.Times)
				}
				return
			}
			t.Log(err)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("publish = %v, want an error with %q", err, tc.want)
			}
			if s, i := f.Count(testRegion); s != tc.left || i != 0 {
				t.Errorf("%d snapshots and %d images left, want %d snapshots", s, i, tc.left)
			}
		})
	}
}
