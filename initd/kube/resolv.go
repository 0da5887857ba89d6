package kube

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"

	"github.com/kilnproject/kiln/internal/atomicfile"
)

// resolvConfPath is the resolver configuration kubelet hands to pods (dnsPolicy Default,
// CoreDNS's upstreams) and reads for every pod it creates.
const resolvConfPath = "/etc/resolv.conf"

// leasesPath is where systemd-networkd keeps its DHCP leases (DNS= lines).
const leasesPath = "/run/systemd/netif/leases"

const resolvMarker = "# Written by kiln-init from the DHCP leases: the image has no resolver configuration.\n"

// EnsureResolvConf gives a node without a resolver configuration an /etc/resolv.conf:
// kubelet fails to create any pod (static pods too) when the file is missing. It lists the
// name servers systemd-networkd's DHCP leases name, and is rewritten while it is kiln's and
// the leases change (first boot may run before DHCP answered; kiln-cni runs again later,
// before the first pod that needs an upstream, CoreDNS, is created). A file someone else
// wrote, or a link to a resolver's file, is left alone.
func EnsureResolvConf(root string) (changed bool, err error) {
	full := filepath.Join(root, resolvConfPath)
	cur, err := os.ReadFile(full)
	switch {
	case err == nil && !strings.HasPrefix(string(cur), resolvMarker):
		return false, nil
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		return false, fmt.Errorf("resolv.conf: %w", err)
	case err != nil:
		if fi, lerr := os.Lstat(full); lerr == nil && fi.Mode()&fs.ModeSymlink != 0 {
			return false, nil // a link to a file a resolver writes later (systemd-resolved)
		}
	}
	want := resolvMarker
	for _, ns := range leaseDNS(filepath.Join(root, leasesPath)) {
		want += "nameserver " + ns + "\n"
	}
	if string(cur) == want {
		return false, nil
	}
	if err := atomicfile.Write(full, []byte(want), atomicfile.Options{Mode: 0o644, DirMode: 0o755}); err != nil {
		return false, fmt.Errorf("resolv.conf: %w", err)
	}
	return true, nil
}

// leaseDNS reads the DNS= servers of systemd-networkd's DHCP leases in dir (at most three,
// the resolver's limit).
func leaseDNS(dir string) []string {
	entries, _ := os.ReadDir(dir)
	var out []string
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(data), "\n") {
			v, ok := strings.CutPrefix(l, "DNS=")
			if !ok {
				continue
			}
			for _, s := range strings.Fields(v) {
				if net.ParseIP(s) != nil && len(out) < 3 {
					out = append(out, s)
				}
			}
		}
	}
	return out
}

// Nameservers are the node's upstream name servers: the nameserver lines of its
// resolv.conf, else its DHCP leases' DNS= servers; loopback addresses (a local stub such as
// systemd-resolved's) are left out. None means the node knows no upstream.
func Nameservers(root string) []string {
	var out []string
	keep := func(s string) {
		if ip := net.ParseIP(s); ip != nil && !ip.IsLoopback() && len(out) < 3 {
			out = append(out, s)
		}
	}
	if b, err := os.ReadFile(filepath.Join(root, resolvConfPath)); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) >= 2 && f[0] == "nameserver" {
				keep(f[1])
			}
		}
	}
	if len(out) == 0 {
		for _, s := range leaseDNS(filepath.Join(root, leasesPath)) {
			keep(s)
		}
	}
	return out
}
