package kube

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/kilnproject/kiln/internal/atomicfile"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

// Where the CNI configuration lives and which kubeconfig reads the node.
const (
	cniBridgeName  = "cni0"
	cniNetworkName = "kiln"
)

// bridgeConfig is the CNI network list for a node whose pods get addresses from
// podCIDRs (one range, or an IPv4 and an IPv6 one): a Linux bridge cni0 that is the pods'
// gateway and masquerades their traffic leaving the node, host-local IPAM on the node's
// ranges, and portmap for hostPort. (containerd's CRI brings the pods' loopback up with
// the loopback plugin itself.)
func bridgeConfig(podCIDRs []string) ([]byte, error) {
	if len(podCIDRs) == 0 {
		return nil, errors.New("cni: the node has no pod CIDR")
	}
	type rng struct {
		Subnet string `json:"subnet"`
	}
	type route struct {
		Dst string `json:"dst"`
	}
	var ranges [][]rng
	var routes []route
	for _, c := range podCIDRs {
		p, err := netip.ParsePrefix(c)
		if err != nil {
			return nil, fmt.Errorf("cni: pod CIDR %q: %w", c, err)
		}
		ranges = append(ranges, []rng{{Subnet: p.Masked().String()}})
		if p.Addr().Is4() {
			routes = append(routes, route{Dst: "0.0.0.0/0"})
		} else {
			routes = append(routes, route{Dst: "::/0"})
		}
	}
	conf := map[string]any{
		"cniVersion": "1.0.0",
		"name":       cniNetworkName,
		"plugins": []any{
			map[string]any{
				"type":        "bridge",
				"bridge":      cniBridgeName,
				"isGateway":   true,
				"ipMasq":      true,
				"hairpinMode": true,
				"ipam": map[string]any{
					"type":   "host-local",
					"ranges": ranges,
					"routes": routes,
				},
			},
			map[string]any{
				"type":         "portmap",
				"capabilities": map[string]bool{"portMappings": true},
				"snat":         true,
			},
		},
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetIndent("", "  ")
	if err := enc.Encode(conf); err != nil {
		return nil, fmt.Errorf("cni: %w", err)
	}
	return b.Bytes(), nil
}

// CNIOptions configure EnsureCNI.
type CNIOptions struct {
	// Root is the node's root; "" means "/".
	Root string
	// NodeName is the Node object to read.
	NodeName string
	// kubeconfig holds the credentials that read it; "" means nodeimage.KubeletConfPath
	// (kubelet's own, which exists once kubelet has its client certificate).
	kubeconfig string
	// Wait bounds the wait for the node to have a pod CIDR; 0 means 15 minutes.
	Wait time.Duration
	// interval is the time between two reads; 0 means 5 seconds.
	interval time.Duration
	// Log receives progress; nil discards it.
	Log *slog.Logger
}

// EnsureCNI writes the bridge CNI configuration for the node's pod CIDR (spec.podCIDRs,
// allocated by kube-controller-manager once the node registered) unless one is there. It
// waits, bounded, for kubelet's credentials, the Node object and its pod CIDR, and returns
// the ranges and whether it wrote the file. A configuration already there is kept: a
// node's pod CIDR does not change while it exists.
func EnsureCNI(ctx context.Context, o CNIOptions) (cidrs []string, changed bool, err error) {
	if o.Root == "" {
		o.Root = "/"
	}
	if o.kubeconfig == "" {
		o.kubeconfig = nodeimage.KubeletConfPath
	}
	if o.Wait == 0 {
		o.Wait = 15 * time.Minute
	}
	if o.interval == 0 {
		o.interval = 5 * time.Second
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	dest := filepath.Join(o.Root, nodeimage.CNIConfPath)
	if _, err := os.Stat(dest); err == nil {
		return nil, false, nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, false, fmt.Errorf("cni: %w", err)
	}
	if o.NodeName == "" {
		return nil, false, errors.New("cni: no node name")
	}
	var node struct {
		Spec struct {
			PodCIDR  string   `json:"podCIDR"`
			PodCIDRs []string `json:"podCIDRs"`
		} `json:"spec"`
	}
	waiting := ""
	err = waitUntil(ctx, o.Wait, o.interval, "node "+o.NodeName+"'s pod CIDR", func(ctx context.Context) (bool, error) {
		c, err := LoadKubeconfig(o.Root, o.kubeconfig)
		if err != nil {
			return false, note(o.Log, &waiting, "kubelet credentials", err)
		}
		if err := c.get(ctx, nodePath(o.NodeName), &node); err != nil {
			return false, note(o.Log, &waiting, "node "+o.NodeName, err)
		}
		if len(node.Spec.PodCIDRs) == 0 && node.Spec.PodCIDR == "" {
			return false, note(o.Log, &waiting, "pod CIDR", fmt.Errorf("node %s has no spec.podCIDR yet (kube-controller-manager allocates it)", o.NodeName))
		}
		return true, nil
	})
	if err != nil {
		return nil, false, fmt.Errorf("cni: %w", err)
	}
	cidrs = node.Spec.PodCIDRs
	if len(cidrs) == 0 {
		cidrs = []string{node.Spec.PodCIDR}
	}
	conf, err := bridgeConfig(cidrs)
	if err != nil {
		return nil, false, err
	}
	if err := atomicfile.Write(dest, conf, atomicfile.Options{Mode: 0o644, DirMode: 0o755}); err != nil {
		return nil, false, fmt.Errorf("cni: %w", err)
	}
	return cidrs, true, nil
}

// note logs what a wait is waiting for when it changes, and returns err.
func note(log *slog.Logger, last *string, what string, err error) error {
	if *last != what {
		*last = what
		log.Info("waiting", "for", what, "reason", err)
	}
	return err
}
