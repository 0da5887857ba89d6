package facts

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// machine describes a fake machine; tree writes it as /proc, /sys and /etc below a
// temporary directory.
type machine struct {
	route, ipv6Route, ifInet6 string
	hostname, cmdline         string
	machineID                 string
	cgroupV2                  bool
	// ifaces: name → MAC; names starting with "v:" are virtual, "lo" is loopback.
	ifaces map[string]string
	addrs  map[string][]string // IPv4 prefixes per interface
}

const (
	routeHeader = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"
	// eth0 holds the default route via 10.0.2.2, plus its subnet route.
	routeEth0 = routeHeader +
		"eth0\t00000000\t0202000A\t0003\t0\t0\t100\t00000000\t0\t0\t0\n" +
		"eth0\t0002000A\t00000000\t0001\t0\t0\t100\t00FFFFFF\t0\t0\t0\n"
	ipv6RouteEth0 = "fd000000000000000000000000000000 40 00000000000000000000000000000000 00 00000000000000000000000000000000 00000100 00000001 00000000 00000001     eth0\n" +
		"00000000000000000000000000000000 00 00000000000000000000000000000000 00 fd000000000000000000000000000001 00000400 00000002 00000000 00000003     eth0\n" +
		"00000000000000000000000000000000 00 00000000000000000000000000000000 00 00000000000000000000000000000000 ffffffff 00000001 00000000 00200200       lo\n"
	ifInet6Eth0 = "fe80000000000000505400fffe123456 02 40 20 80     eth0\n" +
		"fd000000000000000000000000000099 02 40 00 21     eth0\n" + // deprecated: skipped
		"fd000000000000000000000000000002 02 40 00 80     eth0\n" +
		"00000000000000000000000000000001 01 80 10 80       lo\n"
)

func qemuMachine() machine {
	return machine{
		route:     routeEth0,
		ipv6Route: ipv6RouteEth0,
		ifInet6:   ifInet6Eth0,
		hostname:  "(none)",
		cmdline:   "root=PARTUUID=x ro kiln.platform=qemu console=ttyS0\n",
		machineID: "3d1219c7c4c5404aaa1f6d2a48adfda4",
		cgroupV2:  true,
		ifaces:    map[string]string{"eth0": "52:54:00:12:34:56", "lo": "00:00:00:00:00:00", "v:ifb0": "5e:90:c0:22:73:aa"},
		addrs:     map[string][]string{"eth0": {"10.0.2.15/24"}, "lo": {"127.0.0.1/8"}},
	}
}

func (m machine) tree(t *testing.T) Options {
	t.Helper()
	dir := t.TempDir()
	write := func(p, s string) {
		t.Helper()
		p = filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("proc/meminfo", "MemTotal:        2048000 kB\nMemFree:          100000 kB\n")
	write("proc/sys/kernel/osrelease", "6.1.0-40-cloud-amd64\n")
	write("proc/sys/kernel/hostname", m.hostname+"\n")
	write("proc/cmdline", m.cmdline)
	write("proc/net/route", m.route)
	if m.ipv6Route != "" {
		write("proc/net/ipv6_route", m.ipv6Route)
		write("proc/net/if_inet6", m.ifInet6)
	}
	write("sys/devices/system/cpu/online", "0-1\n")
	if m.cgroupV2 {
		write("sys/fs/cgroup/cgroup.controllers", "cpu io memory pids\n")
	}
	if m.machineID != "" {
		write("etc/machine-id", m.machineID+"\n")
	}
	if err := os.MkdirAll(filepath.Join(dir, "sys/class/net"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, mac := range m.ifaces {
		dev, typ := "devices/pci0000:00/0000:00:03.0/virtio0/net/"+name, "1"
		if n, ok := strings.CutPrefix(name, "v:"); ok {
			name, dev = n, "devices/virtual/net/"+n
		}
		if name == "lo" {
			dev, typ = "devices/virtual/net/lo", arphrdLoopback
		}
		write(filepath.Join("sys", dev, "address"), mac+"\n")
		write(filepath.Join("sys", dev, "type"), typ+"\n")
		if err := os.Symlink("../../"+dev, filepath.Join(dir, "sys/class/net", name)); err != nil {
			t.Fatal(err)
		}
	}
	return Options{
		Root:     dir,
		ProcRoot: filepath.Join(dir, "proc"),
		SysRoot:  filepath.Join(dir, "sys"),
		Addrs: func(name string) ([]netip.Prefix, error) {
			var out []netip.Prefix
			for _, s := range m.addrs[name] {
				out = append(out, netip.MustParsePrefix(s))
			}
			return out, nil
		},
	}
}

// gatherCase changes the fake machine or the options, and says how the facts differ.
type gatherCase struct {
	name   string
	change func(*machine, *Options)
	want   func(*Facts)
}

var gatherCases = []gatherCase{
	{
		name: "qemu, no name anywhere: generated from the primary MAC",
		want: func(*Facts) {},
	},
	{
		name:   "config name wins, lower-cased, trailing dot dropped",
		change: func(_ *machine, o *Options) { o.Hostname = "CP-1.example.com."; o.Platform.Hostname = "ip-10-0-0-1" },
		want:   func(f *Facts) { f.Hostname, f.HostnameSource = "cp-1.example.com", FromConfig },
	},
	{
		name: "platform metadata: name, instance, zone; region derived",
		change: func(m *machine, o *Options) {
			m.hostname = "worker-7"
			o.Platform = Platform{Name: "aws", Hostname: "ip-10-0-2-15.ec2.internal", InstanceID: "i-0abc", Zone: "us-east-1a"}
		},
		want: func(f *Facts) {
			f.Hostname, f.HostnameSource = "ip-10-0-2-15.ec2.internal", fromPlatform
			f.Platform, f.InstanceID, f.Zone, f.Region = "aws", "i-0abc", "us-east-1a", "us-east-1"
		},
	},
	{
		name:   "kernel hostname set by DHCP",
		change: func(m *machine, _ *Options) { m.hostname = "Worker-7" },
		want:   func(f *Facts) { f.Hostname, f.HostnameSource = "worker-7", fromKernel },
	},
	{
		name:   "platform placeholder falls through to the kernel",
		change: func(m *machine, o *Options) { m.hostname = "worker-7"; o.Platform.Hostname = "localhost" },
		want:   func(f *Facts) { f.Hostname, f.HostnameSource = "worker-7", fromKernel },
	},
	{
		name: "lowest metric default route wins; IPv4-only kernel",
		change: func(m *machine, _ *Options) {
			m.route = routeHeader +
				"eth0\t00000000\t0202000A\t0003\t0\t0\t600\t00000000\t0\t0\t0\n" +
				"eth1\t00000000\t0101A8C0\t0003\t0\t0\t100\t00000000\t0\t0\t0\n"
			m.ipv6Route = ""
			m.ifaces["eth1"] = "52:54:00:ab:cd:ef"
			m.addrs["eth1"] = []string{"169.254.3.3/16", "192.168.1.20/24"}
		},
		want: func(f *Facts) {
			f.Interface, f.IPv4, f.IPv6 = "eth1", "192.168.1.20", ""
			f.Hostname = "kiln-525400abcdef"
			f.MACs["eth1"] = "52:54:00:ab:cd:ef"
		},
	},
	{
		name: "no default route: first interface with an address",
		change: func(m *machine, _ *Options) {
			m.route = routeHeader
			m.ipv6Route = "00000000000000000000000000000000 00 00000000000000000000000000000000 00 00000000000000000000000000000000 ffffffff 00000001 00000000 00200200       lo\n"
		},
		want: func(*Facts) {},
	},
	{
		name: "IPv6-only: the IPv6 default route names the primary interface",
		change: func(m *machine, _ *Options) {
			m.route = routeHeader
			m.addrs = nil
		},
		want: func(f *Facts) { f.IPv4 = "" },
	},
	{
		name:   "uninitialised machine id, cgroup v1",
		change: func(m *machine, _ *Options) { m.machineID = "uninitialized"; m.cgroupV2 = false },
		want:   func(f *Facts) { f.MachineID, f.CgroupV2 = "", false },
	},
}

func TestGather(t *testing.T) {
	for _, tc := range gatherCases {
		t.Run(tc.name, func(t *testing.T) { checkGather(t, tc) })
	}
}

// checkGather gathers the facts of a fake machine changed by tc and checks them.
func checkGather(t *testing.T, tc gatherCase) {
	m := qemuMachine()
	var o Options
	if tc.change != nil {
		tc.change(&m, &o)
	}
	opts := m.tree(t)
	opts.Hostname, opts.Platform = o.Hostname, o.Platform
	got, err := Gather(context.Background(), opts)
	if err != nil {
		t.Fatalf("Gather: %v", err)
	}
	want := &Facts{
		Hostname: "kiln-525400123456", HostnameSource: fromGenerated,
		Interface: "eth0", IPv4: "10.0.2.15", IPv6: "fd00::2",
		MACs:     map[string]string{"eth0": "52:54:00:12:34:56"},
		Platform: "qemu", MachineID: "3d1219c7c4c5404aaa1f6d2a48adfda4",
		CPUs: 2, MemoryMB: 2000, KernelVersion: "6.1.0-40-cloud-amd64", CgroupV2: true,
	}
	tc.want(want)
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Gather:\n got %+v\nwant %+v", got, want)
	}
}

func TestGatherErrors(t *testing.T) {
	tests := []struct {
		name   string
		change func(*machine, *Options)
		after  func(root string) // edits the written tree
		want   string
	}{
		{name: "invalid config hostname", change: func(_ *machine, o *Options) { o.Hostname = "node_1" },
			want: `hostname from the config: hostname "node_1": label 1 "node_1" contains '_'`},
		{name: "config placeholder", change: func(_ *machine, o *Options) { o.Hostname = "localhost" },
			want: `hostname "localhost" from the config is a placeholder`},
		{name: "invalid DHCP hostname", change: func(m *machine, _ *Options) { m.hostname = "-bad" },
			want: "hostname from the kernel"},
		{name: "no name, no MAC, no machine id", change: func(m *machine, _ *Options) {
			m.machineID = ""
			m.ifaces = map[string]string{"eth0": "00:00:00:00:00:00"}
		}, want: "no hostname"},
		{name: "corrupt route table", change: func(m *machine, _ *Options) { m.route = routeHeader + "eth0 zz\n" },
			want: "net/route line 2"},
		{name: "no meminfo", after: func(root string) { os.Remove(filepath.Join(root, "proc/meminfo")) },
			want: "memory size"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := qemuMachine()
			var o Options
			if tc.change != nil {
				tc.change(&m, &o)
			}
			opts := m.tree(t)
			opts.Hostname = o.Hostname
			if tc.after != nil {
				tc.after(opts.Root)
			}
			_, err := Gather(context.Background(), opts)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Gather error = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestFactsJSON(t *testing.T) {
	f, err := Gather(context.Background(), qemuMachine().tree(t))
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"hostname":"kiln-525400123456"`, `"ipv4":"10.0.2.15"`, `"macs":{"eth0":"52:54:00:12:34:56"}`, `"cgroupV2":true`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("JSON %s lacks %s", b, want)
		}
	}
	var back Facts
	if err := json.Unmarshal(b, &back); err != nil || !reflect.DeepEqual(&back, f) {
		t.Errorf("JSON round trip: %v\n got %+v\nwant %+v", err, back, *f)
	}
}

func TestValidateHostname(t *testing.T) {
	long := strings.Repeat("a", 63)
	tests := []struct {
		name string
		ok   bool
	}{
		{"node-1", true},
		{"ip-10-0-2-15.ec2.internal", true},
		{"0node", true},
		{long, true},
		{strings.Join([]string{long, long, long, strings.Repeat("a", 61)}, "."), true}, // 253
		{strings.Join([]string{long, long, long, strings.Repeat("a", 62)}, "."), false},
		{long + "a", false},
		{"", false},
		{"Node", false},
		{"node_1", false},
		{"-node", false},
		{"node-", false},
		{"a..b", false},
		{"node.", false},
	}
	for _, tc := range tests {
		err := ValidateHostname(tc.name)
		if (err == nil) != tc.ok {
			t.Errorf("ValidateHostname(%q) = %v, want ok=%v", tc.name, err, tc.ok)
		}
	}
}

// TestGatherThisMachine reads the real /proc and /sys.
func TestGatherThisMachine(t *testing.T) {
	f, err := Gather(context.Background(), Options{})
	if err != nil {
		t.Fatalf("Gather: %v", err)
	}
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		t.Fatal(err)
	}
	if rel := unix.ByteSliceToString(uts.Release[:]); f.KernelVersion != rel {
		t.Errorf("KernelVersion = %q, uname says %q", f.KernelVersion, rel)
	}
	var si unix.Sysinfo_t
	if err := unix.Sysinfo(&si); err != nil {
		t.Fatal(err)
	}
	if mb := int64(si.Totalram) * int64(si.Unit) / (1 << 20); f.MemoryMB != mb {
		t.Errorf("MemoryMB = %d, sysinfo says %d", f.MemoryMB, mb)
	}
	if f.CPUs < 1 {
		t.Errorf("CPUs = %d", f.CPUs)
	}
	if err := ValidateHostname(f.Hostname); err != nil {
		t.Errorf("Hostname: %v", err)
	}
	t.Logf("facts: %s", fmt.Sprintf("%+v", *f))
}
