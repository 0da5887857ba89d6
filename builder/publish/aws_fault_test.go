package publish

import (
	"context"
	"strings"
	"testing"
)

// Transient failures are retried and the publish succeeds; a refused call is an error
// naming the permission, and a failed publish leaves nothing behind, or names what it left.
func TestPublishAWSFaults(t *testing.T) {
	for _, tc := range []struct {
		name   string
		faults []*fault
		want   string // error substring; "" succeeds
		left   int    // snapshots left in the fake when the publish fails
	}{
		{name: "EBS throttling", faults: []*fault{
			{op: "PutSnapshotBlock", times: 4, status: 400, code: "RequestThrottledException", reason: "ACCOUNT_THROTTLED", msg: "Rate exceeded"},
			{op: "StartSnapshot", times: 1, status: 400, code: "RequestThrottledException", reason: "ACCOUNT_THROTTLED", msg: "Rate exceeded"},
		}},
		{name: "EC2 throttling and 5xx", faults: []*fault{
			{op: "RegisterImage", times: 2, status: 503, code: "RequestLimitExceeded", msg: "Request limit exceeded."},
			{op: "DescribeSnapshots", times: 1, status: 500, code: "InternalError", msg: "An internal error has occurred"},
		}},
		{name: "EBS internal errors", faults: []*fault{
			{op: "PutSnapshotBlock", after: 2, times: 3, status: 500, code: "InternalServerException", msg: "internal error"},
			{op: "CompleteSnapshot", times: 1, status: 503, code: "InternalServerException", msg: "unavailable"},
		}},
		{name: "connection cut mid-upload", faults: []*fault{{op: "PutSnapshotBlock", after: 3, times: 3, cut: true}}},
		{name: "connection cut for good", faults: []*fault{{op: "PutSnapshotBlock", after: 3, times: -1, cut: true}},
			want: "PutSnapshotBlock in eu-west-1"},
		{name: "StartSnapshot denied", faults: []*fault{{op: "StartSnapshot", times: -1, status: 403, code: "AccessDeniedException", reason: "UNAUTHORIZED_ACCOUNT",
			msg: "User: arn:aws:iam::111122223333:user/ci is not authorized to perform: ebs:StartSnapshot"}},
			want: "StartSnapshot in eu-west-1: access denied: the credentials need the IAM permission ebs:StartSnapshot"},
		{name: "PutSnapshotBlock denied", faults: []*fault{{op: "PutSnapshotBlock", after: 2, times: -1, status: 403, code: "AccessDeniedException", msg: "not authorized to perform: ebs:PutSnapshotBlock"}},
			want: "the credentials need the IAM permission ebs:PutSnapshotBlock"},
		{name: "RegisterImage denied", faults: []*fault{{op: "RegisterImage", times: -1, status: 403, code: "UnauthorizedOperation", msg: "You are not authorized to perform this operation."}},
			want: "the credentials need the IAM permission ec2:RegisterImage"},
		{name: "denied, and the snapshot cannot be deleted", faults: []*fault{
			{op: "PutSnapshotBlock", times: -1, status: 403, code: "AccessDeniedException", msg: "not authorized"},
			{op: "DeleteSnapshot", times: -1, status: 403, code: "UnauthorizedOperation", msg: "You are not authorized to perform this operation."},
		}, want: "left behind in eu-west-1: snapshot snap-00000000000000001", left: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeAWS(t)
			f.faults = tc.faults
			a := f.start()
			path, content := testImage(t, t.TempDir(), testDiskSize, scattered())
			im, err := Load(path)
			if err != nil {
				t.Fatal(err)
			}
			res, err := a.Publish(context.Background(), im, newRequest())
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				checkSnapshot(t, f, testRegion, res.SnapshotID, content)
				if f.image(testRegion, res.ImageID) == nil {
					t.Errorf("no image %s", res.ImageID)
				}
				for _, ft := range tc.faults {
					if ft.times != 0 {
						t.Errorf("%s failed fewer times than the fault asked (%d to go)", ft.op, ft.times)
					}
				}
				return
			}
			t.Log(err)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("publish = %v, want an error with %q", err, tc.want)
			}
			if s, i := f.count(testRegion); s != tc.left || i != 0 {
				t.Errorf("%d snapshots and %d images left, want %d snapshots", s, i, tc.left)
			}
		})
	}
}
