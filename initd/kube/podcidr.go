package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"math/big"
	"net/http"
	"net/netip"
	"slices"
	"strings"

	"github.com/kilnproject/kiln/internal/nodeimage"
)

// kube-controller-manager's default node range sizes (--node-cidr-mask-size-ipv4/-ipv6):
// the ranges it cuts the cluster's pod CIDR into, one per node.
const (
	nodeMaskIPv4 = 24
	nodeMaskIPv6 = 64
)

// ReservedPodCIDRs returns the pod ranges the control plane of the given index (its place
// in etcd.members) gives its own node when the node has none (BootstrapOptions.PodCIDRs):
// for each range of the cluster's pod CIDR ("10.244.0.0/16", or a dual-stack "v4,v6"), the
// index-th from the top of the ranges kube-controller-manager cuts it into. The
// controller-manager hands ranges out from the bottom and counts a range a node already has
// as used, so the two do not meet, and each control plane of an HA cluster has its own. It
// returns nil when a cluster range is not split into at least 2×(index+1) node ranges.
//
// A control plane's node is Ready only once kiln-cni wrote the bridge configuration for its
// range; with the range given at registration that does not wait for the controller-manager,
// which starts after the API server is ready.
func ReservedPodCIDRs(clusterCIDR string, index int) []string {
	if index < 0 {
		return nil
	}
	var out []string
	for _, s := range strings.Split(clusterCIDR, ",") {
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil {
			return nil
		}
		p = p.Masked()
		mask := nodeMaskIPv4
		if p.Addr().Is6() {
			mask = nodeMaskIPv6
		}
		if mask <= p.Bits() {
			return nil
		}
		// The cluster range holds 2^(mask-bits) node ranges; keep to the upper half, and
		// take range number count-1-index: its number shifted above the host bits, or'ed
		// with the cluster range's address.
		count := new(big.Int).Lsh(big.NewInt(1), uint(mask-p.Bits()))
		if big.NewInt(int64(index)).Cmp(new(big.Int).Rsh(count, 1)) >= 0 {
			return nil
		}
		n := count.Sub(count, big.NewInt(int64(index)+1))
		n.Lsh(n, uint(p.Addr().BitLen()-mask))
		n.Or(n, new(big.Int).SetBytes(p.Addr().AsSlice()))
		addr, _ := netip.AddrFromSlice(n.FillBytes(make([]byte, p.Addr().BitLen()/8)))
		out = append(out, netip.PrefixFrom(addr, mask).String())
	}
	return out
}

// podCIDR gives this node b.o.PodCIDRs as soon as kubelet registered it, with
// super-admin.conf (the RBAC roles need not be there yet): unless the node has ranges
// already (kube-controller-manager was first) or another node has one of them (left behind
// by a control plane of that index removed without its Node object). Either case is logged
// and left to the controller-manager; nothing here fails the bootstrap.
func (b *bootstrap) podCIDR(ctx context.Context) (bool, error) {
	c, err := LoadKubeconfig(b.o.Root, nodeimage.SuperAdminConfPath)
	if err != nil {
		return false, err
	}
	path := nodePath(b.o.NodeName)
	type node struct {
		Metadata struct {
			Name            string `json:"name"`
			ResourceVersion string `json:"resourceVersion"`
		} `json:"metadata"`
		Spec struct {
			PodCIDRs []string `json:"podCIDRs"`
		} `json:"spec"`
	}
	if err := b.waitNode(ctx, c, b.o.APIWait+b.o.NodeWait); err != nil {
		return false, err
	}
	changed, err := b.retry(ctx, func(ctx context.Context) (bool, error) {
		var n node
		if err := c.get(ctx, path, &n); err != nil {
			return false, err
		}
		if len(n.Spec.PodCIDRs) > 0 {
			if !slices.Equal(n.Spec.PodCIDRs, b.o.PodCIDRs) {
				b.o.Log.Info("node has pod ranges already", "node", b.o.NodeName, "podCIDRs", n.Spec.PodCIDRs)
			}
			return false, nil
		}
		var all struct{ Items []node }
		if err := c.get(ctx, "/api/v1/nodes", &all); err != nil {
			return false, err
		}
		for _, o := range all.Items {
			for _, r := range o.Spec.PodCIDRs {
				if o.Metadata.Name != b.o.NodeName && slices.Contains(b.o.PodCIDRs, r) {
					b.o.Log.Warn("reserved pod range taken: kube-controller-manager allocates this node's", "node", b.o.NodeName, "range", r, "taken_by", o.Metadata.Name)
					return false, nil
				}
			}
		}
		patch, err := json.Marshal(map[string]any{
			"metadata": map[string]any{"resourceVersion": n.Metadata.ResourceVersion}, // a change meanwhile is a conflict: retried
			"spec":     map[string]any{"podCIDR": b.o.PodCIDRs[0], "podCIDRs": b.o.PodCIDRs},
		})
		if err != nil {
			return false, err
		}
		if err := c.do(ctx, http.MethodPatch, path, contentMergePatch, patch, nil); err != nil {
			return false, fmt.Errorf("give node %s its pod ranges: %w", b.o.NodeName, err)
		}
		b.o.Log.Info("node given its reserved pod ranges", "node", b.o.NodeName, "podCIDRs", b.o.PodCIDRs)
		return true, nil
	})
	if err != nil && ctx.Err() == nil {
		b.o.Log.Warn("node not given its reserved pod ranges: kube-controller-manager allocates them", "node", b.o.NodeName, "err", err)
		return false, nil
	}
	return changed, err
}
