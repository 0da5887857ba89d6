package kube

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kilnproject/kiln/initd/task"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

// testPodCIDR is the cluster's pod range in the rendered control plane (config.DefaultPodCIDR).
const testPodCIDR = "10.244.0.0/16"

func TestReservedPodCIDRs(t *testing.T) {
	for _, tc := range []struct {
		cidr  string
		index int
		want  []string
	}{
		{"10.244.0.0/16", 0, []string{"10.244.255.0/24"}},
		{"10.244.0.0/16", 2, []string{"10.244.253.0/24"}},
		{"10.244.0.0/16", 127, []string{"10.244.128.0/24"}},
		{"10.244.0.0/16", 128, nil}, // the lower half is the controller-manager's
		{"10.244.0.0/23", 0, []string{"10.244.1.0/24"}},
		{"10.244.0.0/23", 1, nil},
		{"10.244.0.0/24", 0, nil}, // one node range: nothing to reserve
		{"10.244.7.0/16", 0, []string{"10.244.255.0/24"}},
		{"fd00:10:244::/48", 0, []string{"fd00:10:244:ffff::/64"}},
		{"10.244.0.0/16,fd00:10:244::/56", 1, []string{"10.244.254.0/24", "fd00:10:244:fe::/64"}},
		{"10.244.0.0/16", -1, nil}, // not an etcd member
		{"not a range", 0, nil},
	} {
		if got := ReservedPodCIDRs(tc.cidr, tc.index); !slices.Equal(got, tc.want) {
			t.Errorf("ReservedPodCIDRs(%q, %d) = %q, want %q", tc.cidr, tc.index, got, tc.want)
		}
	}
}

// TestPodCIDRAtRegistration: with no kube-controller-manager running (as on a first control
// plane, whose controller-manager starts after its API server is ready), the bootstrap gives
// the node its reserved pod range once kubelet registered it, and kiln-cni writes the bridge
// configuration from it at once. A reserved range another node holds is left alone.
func TestPodCIDRAtRegistration(t *testing.T) {
	cpCtx, root, _ := controlPlaneWith(t, false)
	ctx, cancel := context.WithTimeout(cpCtx, 5*time.Minute)
	defer cancel()
	go registerNode(ctx, root)

	// A node left behind by a removed control plane holds the range of index 1.
	super, err := LoadKubeconfig(root, nodeimage.SuperAdminConfPath)
	if err != nil {
		t.Fatal(err)
	}
	taken := ReservedPodCIDRs(testPodCIDR, 1)
	stale, _ := json.Marshal(object{"apiVersion": "v1", "kind": "Node", "metadata": map[string]any{"name": "cp-gone"},
		"spec": map[string]any{"podCIDR": taken[0], "podCIDRs": taken}})
	err = waitUntil(ctx, 3*time.Minute, time.Second, "the API server", func(ctx context.Context) (bool, error) {
		err := super.do(ctx, http.MethodPost, "/api/v1/nodes", contentJSON, stale, nil)
		return err == nil || isConflict(err), err
	})
	if err != nil {
		t.Fatal(err)
	}
	nodeRanges := func() []string {
		var n struct{ Spec struct{ PodCIDRs []string } }
		if err := super.get(ctx, "/api/v1/nodes/"+testNode, &n); err != nil {
			t.Fatal(err)
		}
		return n.Spec.PodCIDRs
	}

	runBootstrap(t, ctx, root, taken...)
	if got := nodeRanges(); len(got) != 0 {
		t.Fatalf("the node took %q, a range another node holds", got)
	}

	mine := ReservedPodCIDRs(testPodCIDR, 0)
	st := runBootstrap(t, ctx, root, mine...)
	if i := slices.IndexFunc(st.Tasks, func(ts task.TaskStatus) bool { return ts.Name == "pod-cidr" }); i < 0 || st.Tasks[i].State != task.StateApplied {
		t.Errorf("pod-cidr task: %+v", st.Tasks)
	}
	if got := nodeRanges(); !slices.Equal(got, mine) {
		t.Fatalf("node ranges %q, want the reserved %q", got, mine)
	}
	cidrs, changed, err := EnsureCNI(ctx, CNIOptions{Root: root, NodeName: testNode, Wait: 10 * time.Second, interval: time.Second})
	if err != nil || !changed || !slices.Equal(cidrs, mine) {
		t.Fatalf("EnsureCNI = %v, %v, %v; want the reserved %q", cidrs, changed, err, mine)
	}
	if b, err := os.ReadFile(filepath.Join(root, nodeimage.CNIConfPath)); err != nil || !strings.Contains(string(b), mine[0]) {
		t.Errorf("%s: %v\n%s", nodeimage.CNIConfPath, err, b)
	}
	// Once it has ranges, a later run leaves them.
	runBootstrap(t, ctx, root, ReservedPodCIDRs(testPodCIDR, 2)...)
	if got := nodeRanges(); !slices.Equal(got, mine) {
		t.Errorf("a second run changed the node's ranges to %q", got)
	}
}
