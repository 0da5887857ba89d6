package netup

import (
	"net"
	"strings"
	"testing"

	"github.com/insomniacslk/dhcp/dhcpv4"
)

func TestLeaseOf(t *testing.T) {
	mac := net.HardwareAddr{0x52, 0x54, 0, 0x12, 0x34, 0x56}
	_, net10, _ := net.ParseCIDR("10.0.0.0/8")
	_, def, _ := net.ParseCIDR("0.0.0.0/0")
	tests := []struct {
		name    string
		mods    []dhcpv4.Modifier
		want    string // Lease.String()
		routes  string
		wantErr string
	}{
		{
			name:   "router option",
			mods:   []dhcpv4.Modifier{dhcpv4.WithYourIP(net.IPv4(192, 168, 1, 7)), dhcpv4.WithNetmask(net.CIDRMask(24, 32)), dhcpv4.WithRouter(net.IPv4(192, 168, 1, 1), net.IPv4(192, 168, 1, 2))},
			want:   "eth0 192.168.1.7/24 via 192.168.1.1 for 1h0m0s",
			routes: "default via 192.168.1.1",
		},
		{
			name: "classless routes replace the router option (RFC 3442)",
			mods: []dhcpv4.Modifier{dhcpv4.WithYourIP(net.IPv4(192, 168, 1, 7)), dhcpv4.WithNetmask(net.CIDRMask(24, 32)), dhcpv4.WithRouter(net.IPv4(192, 168, 1, 1)),
				dhcpv4.WithOption(dhcpv4.OptClasslessStaticRoute(&dhcpv4.Route{Dest: net10, Router: net.IPv4(192, 168, 1, 9)}, &dhcpv4.Route{Dest: def, Router: net.IPv4(192, 168, 1, 254)}))},
			want:   "eth0 192.168.1.7/24 via 192.168.1.254 for 1h0m0s",
			routes: "10.0.0.0/8 via 192.168.1.9; default via 192.168.1.254",
		},
		{
			name: "no netmask: the address's class, no router: no default route",
			mods: []dhcpv4.Modifier{dhcpv4.WithYourIP(net.IPv4(10, 1, 2, 3))},
			want: "eth0 10.1.2.3/8 for 1h0m0s",
		},
		{name: "no address", mods: nil, wantErr: "DHCP lease on eth0: the server gave no address"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ack, err := dhcpv4.New(tt.mods...)
			if err != nil {
				t.Fatal(err)
			}
			l, routes, err := leaseOf(&offered{link: "eth0", mac: mac, ack: ack})
			if tt.wantErr != "" {
				if err == nil || err.Error() != tt.wantErr {
					t.Fatalf("leaseOf error = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if l.String() != tt.want {
				t.Errorf("lease = %q, want %q", l, tt.want)
			}
			var rs []string
			for _, r := range routes {
				dst := "default"
				if r.dst != nil {
					dst = r.dst.String()
				}
				rs = append(rs, dst+" via "+r.gw.String())
			}
			if got := strings.Join(rs, "; "); got != tt.routes {
				t.Errorf("routes = %q, want %q", got, tt.routes)
			}
		})
	}
}
