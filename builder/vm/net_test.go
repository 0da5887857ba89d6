package vm

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// nicArgs returns the -netdev and -device values of Args, in order.
func nicArgs(t *testing.T, cfg Config) (netdevs, devices []string, err error) {
	t.Helper()
	args, err := Args(context.Background(), cfg, t.TempDir())
	if err != nil {
		return nil, nil, err
	}
	for i := 0; i+1 < len(args); i++ {
		switch {
		case args[i] == "-netdev":
			netdevs = append(netdevs, args[i+1])
		case args[i] == "-device" && strings.HasPrefix(args[i+1], "virtio-net-pci"):
			devices = append(devices, args[i+1])
		}
	}
	return netdevs, devices, nil
}

func testImage(t *testing.T) string {
	t.Helper()
	if _, _, err := Firmware(); err != nil {
		t.Skip(err)
	}
	img := filepath.Join(t.TempDir(), "node-1.raw")
	if err := os.WriteFile(img, make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	return img
}

func TestNetworkArgs(t *testing.T) {
	img := testImage(t)
	for _, tc := range []struct {
		name             string
		cfg              Config
		netdevs, devices []string
	}{
		{
			name:    "user network only",
			cfg:     Config{},
			netdevs: []string{"user,id=user0"},
			devices: []string{"virtio-net-pci,netdev=user0,addr=18"},
		},
		{
			name: "links first, user network last, offline with forwards",
			cfg: Config{Links: []Link{{Name: "cluster"}, {Name: "storage", MAC: "02:AA:00:00:00:01"}}, Offline: true,
				Forward: map[string]int{"127.0.0.1:6443": 6443, "8080": 80}},
			netdevs: []string{
				"socket,id=link0,mcast=" + LinkGroup("cluster") + ",localaddr=127.0.0.1",
				"socket,id=link1,mcast=" + LinkGroup("storage") + ",localaddr=127.0.0.1",
				"user,id=user0,restrict=on,hostfwd=tcp:127.0.0.1:6443-:6443,hostfwd=tcp:127.0.0.1:8080-:80",
			},
			devices: []string{
				"virtio-net-pci,netdev=link0,mac=" + LinkMAC(img, "cluster") + ",addr=10",
				"virtio-net-pci,netdev=link1,mac=02:aa:00:00:00:01,addr=11",
				"virtio-net-pci,netdev=user0,addr=18",
			},
		},
		{
			name:    "user network range",
			cfg:     Config{Net: "10.0.3.0/24"},
			netdevs: []string{"user,id=user0,net=10.0.3.0/24"},
			devices: []string{"virtio-net-pci,netdev=user0,addr=18"},
		},
		{
			name:    "metadata address as the host's",
			cfg:     Config{Net: "169.254.0.0/15", NetHost: "169.254.169.254", NetDHCPStart: "169.255.0.15"},
			netdevs: []string{"user,id=user0,net=169.254.0.0/15,host=169.254.169.254,dhcpstart=169.255.0.15"},
			devices: []string{"virtio-net-pci,netdev=user0,addr=18"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.Image, tc.cfg.Accel = img, "tcg"
			netdevs, devices, err := nicArgs(t, tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			if strings.Join(netdevs, "\n") != strings.Join(tc.netdevs, "\n") {
				t.Errorf("netdevs:\n%s\nwant:\n%s", strings.Join(netdevs, "\n"), strings.Join(tc.netdevs, "\n"))
			}
			if strings.Join(devices, "\n") != strings.Join(tc.devices, "\n") {
				t.Errorf("NICs:\n%s\nwant:\n%s", strings.Join(devices, "\n"), strings.Join(tc.devices, "\n"))
			}
		})
	}
}

func TestNetworkArgsErrors(t *testing.T) {
	img := testImage(t)
	many := make([]Link, MaxLinks+1)
	for i := range many {
		many[i].Name = "l" + string(rune('a'+i))
	}
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{Links: []Link{{Name: "my link"}}}, `link "my link": name must be`},
		{Config{Links: []Link{{Name: ""}}}, `link "": name must be`},
		{Config{Links: []Link{{Name: "a"}, {Name: "a"}}}, `link "a" given twice`},
		{Config{Links: []Link{{Name: "a", MAC: "01:00:00:00:00:01"}}}, "multicast address"},
		{Config{Links: []Link{{Name: "a", MAC: "zz"}}}, `MAC "zz"`},
		{Config{Links: []Link{{Name: "a", MAC: "02:00:00:00:00:01"}, {Name: "b", MAC: "02:00:00:00:00:01"}}}, "same MAC"},
		{Config{Links: many}, "at most 8"},
		{Config{Forward: map[string]int{"127.0.0.1:http": 80}}, `forward "127.0.0.1:http"`},
		{Config{Forward: map[string]int{"8080": 0}}, "guest port 0"},
		{Config{Net: "10.0.3.0/24,restrict=off"}, "user network"},
		{Config{Net: "10.0.3.0/24", NetHost: "169.254.169.254"}, `host address 169.254.169.254 is not inside the network "10.0.3.0/24"`},
		{Config{NetHost: "10.0.2.2"}, `host address 10.0.2.2 is not inside the network ""`},
		{Config{Net: "10.0.3.0/24", NetDHCPStart: "fd00::15"}, `dhcpstart address "fd00::15": want an IPv4 address`},
	} {
		tc.cfg.Image, tc.cfg.Accel = img, "tcg"
		_, err := Args(context.Background(), tc.cfg, t.TempDir())
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want an error containing %q", tc.cfg, err, tc.want)
		}
	}
}

// Derived MACs are stable, unicast and locally administered, differ per image file and per
// link, and ignore the directory; link groups are admin-scoped multicast.
func TestLinkMACAndGroup(t *testing.T) {
	a := LinkMAC("/x/node-1.raw", "cluster")
	if a != LinkMAC("/y/node-1.raw", "cluster") {
		t.Errorf("MAC depends on the image's directory")
	}
	if a == LinkMAC("/x/node-2.raw", "cluster") || a == LinkMAC("/x/node-1.raw", "other") {
		t.Errorf("MAC %s does not depend on image and link", a)
	}
	if m, err := normalMAC(a); err != nil || m != a || !strings.HasPrefix(a, "02:") {
		t.Errorf("MAC %s: %v", a, err)
	}
	g := LinkGroup("cluster")
	if !strings.HasPrefix(g, "239.255.") || g != LinkGroup("cluster") || g == LinkGroup("other") {
		t.Errorf("group %s", g)
	}
}

// QEMU itself accepts the network arguments.
func TestQEMUAcceptsNetworkArgs(t *testing.T) {
	img := testImage(t)
	qemuAccepts(t, Config{Image: img, Accel: "tcg", Offline: true, MemoryMB: 128,
		Links: []Link{{Name: "kiln-test-" + filepath.Base(t.TempDir())}, {Name: "kiln-test-2", MAC: "02:00:00:00:00:02"}},
		Disks: []Disk{{Name: "d1", Size: "1M"}, {Name: "d2", Size: "1M"}}})
}

// qemuAccepts checks that QEMU builds the machine cfg describes (paused, -S) instead of exiting
// with a usage error: QMP answers a command only from the main loop, which runs once every
// device is realized.
func qemuAccepts(t *testing.T, cfg Config) {
	t.Helper()
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Skip("qemu-system-x86_64 not installed")
	}
	work := t.TempDir()
	args, err := Args(context.Background(), cfg, work)
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(work, "qmp.sock")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "qemu-system-x86_64", append(args, "-S", "-qmp", "unix:"+sock+",server=on,wait=off")...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	defer func() { cmd.Process.Kill(); <-done }()
	for {
		if qmpStatus(sock) == nil {
			return
		}
		select {
		case err := <-done:
			done <- err
			t.Fatalf("qemu exited: %v: %s", err, stderr.String())
		case <-ctx.Done():
			t.Fatalf("qemu built no machine in time: %s", stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// qmpStatus asks QEMU's QMP socket for the VM's status.
func qmpStatus(sock string) error {
	c, err := net.DialTimeout("unix", sock, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	r := bufio.NewReader(c)
	if _, err := r.ReadString('\n'); err != nil { // the greeting
		return err
	}
	for _, cmd := range []string{"qmp_capabilities", "query-status"} {
		if _, err := fmt.Fprintf(c, `{"execute":%q}`+"\n", cmd); err != nil {
			return err
		}
		line, err := r.ReadString('\n')
		if err != nil {
			return err
		}
		if !strings.Contains(line, `"return"`) {
			return fmt.Errorf("%s: %s", cmd, line)
		}
	}
	return nil
}
