package preflight

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/kilnproject/kiln/initd/firstboot/facts"
)

// Minimums from kubeadm.
const (
	minCPUs     = 2
	minMemoryMB = 1700
)

// check is one row of the table.
type check struct {
	name string
	// roles maps each role the check applies to to its severity there; a role not in
	// the map does not run the check (as kubeadm's join skips CPU and memory checks on
	// workers).
	roles map[Role]Severity
	run   func(ctx context.Context) (msg string, err error)
}

// table lists the checks in the order they run and are reported.
//
// Deliberate differences from kubeadm: the hostname check is an error (kubeadm warns),
// because kubelet cannot register an invalid node name; swap is an error, because kiln's
// kubelet configuration keeps failSwapOn; lost+found in the etcd data directory is
// allowed, because that directory is a volume's mount point.
func table(o Options) []check {
	allError := map[Role]Severity{ControlPlane: Error, Worker: Error, Etcd: Error}
	controlPlane := map[Role]Severity{ControlPlane: Error}
	etcdMember := map[Role]Severity{ControlPlane: Error, Etcd: Error}
	// sizing: kubeadm checks CPUs and memory for control planes only; an etcd node gets
	// a warning.
	sizing := map[Role]Severity{ControlPlane: Error, Etcd: Warning}
	// runtime: at first boot the runtime may not be up yet on nodes that only run
	// kubelet's workloads; a control plane cannot start without it. Callers that run
	// preflight before starting the runtime pass Skip: []string{"cri-socket"}.
	runtime := map[Role]Severity{ControlPlane: Error, Worker: Warning, Etcd: Warning}
	cs := []check{
		{"root", allError, func(context.Context) (string, error) {
			if id := o.EUID(); id != 0 {
				return "", fmt.Errorf("running as user id %d; root is required", id)
			}
			return "running as root", nil
		}},
		{"cpus", sizing, func(context.Context) (string, error) {
			if n := o.Facts.CPUs; n < minCPUs {
				return "", fmt.Errorf("%d CPU(s) available; at least %d are required", n, minCPUs)
			}
			return fmt.Sprintf("%d CPUs", o.Facts.CPUs), nil
		}},
		{"memory", sizing, func(context.Context) (string, error) {
			if mb := o.Facts.MemoryMB; mb < minMemoryMB {
				return "", fmt.Errorf("%d MB of memory; at least %d MB are required", mb, minMemoryMB)
			}
			return fmt.Sprintf("%d MB", o.Facts.MemoryMB), nil
		}},
		{"cgroup-v2", allError, func(context.Context) (string, error) { return cgroupV2(o.CgroupDir) }},
		{"cri-socket", runtime, func(ctx context.Context) (string, error) { return criAnswers(ctx, o.CRISocket) }},
		{"hostname", allError, func(context.Context) (string, error) {
			if err := facts.ValidateHostname(o.Hostname); err != nil {
				return "", fmt.Errorf("node name: %w", err)
			}
			return fmt.Sprintf("%q is an RFC 1123 subdomain", o.Hostname), nil
		}},
	}
	for _, p := range []struct {
		port  int
		what  string
		roles map[Role]Severity
	}{
		{o.Ports.APIServer, "kube-apiserver", controlPlane},
		{o.Ports.Scheduler, "kube-scheduler", controlPlane},
		{o.Ports.ControllerManager, "kube-controller-manager", controlPlane},
		{o.Ports.Kubelet, "kubelet", allError},
		{o.Ports.EtcdClient, "etcd clients", etcdMember},
		{o.Ports.EtcdPeer, "etcd peers", etcdMember},
	} {
		cs = append(cs, check{"port-" + strconv.Itoa(p.port), p.roles, func(ctx context.Context) (string, error) {
			return portFree(ctx, o.ListenHost, p.port, p.what)
		}})
	}
	cs = append(cs,
		check{"manifests-dir", allError, func(context.Context) (string, error) { return dirEmpty(o.Root, o.ManifestsDir) }},
		check{"etcd-data-dir", etcdMember, func(context.Context) (string, error) {
			return dirEmpty(o.Root, o.EtcdDataDir, "lost+found")
		}},
		check{"swap", allError, func(context.Context) (string, error) { return swapOff(filepath.Join(o.ProcRoot, "swaps")) }},
	)
	for _, tool := range []string{"ip", "iptables", "mount", "nsenter"} {
		cs = append(cs, check{"path-" + tool, allError, func(context.Context) (string, error) { return inPath(o.Path, tool) }})
	}
	return cs
}

func cgroupV2(dir string) (string, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return "", fmt.Errorf("statfs %s: %w", dir, err)
	}
	if st.Type != unix.CGROUP2_SUPER_MAGIC {
		kind := fmt.Sprintf("filesystem type 0x%x", st.Type)
		if st.Type == unix.TMPFS_MAGIC {
			kind = "tmpfs (cgroup v1 or hybrid hierarchy)"
		}
		return "", fmt.Errorf("%s is %s, not the unified cgroup v2 hierarchy; kubelet requires cgroup v2", dir, kind)
	}
	return dir + " is cgroup v2", nil
}

// http2Preface is the client connection preface (RFC 9113 §3.4) followed by an empty
// SETTINGS frame: 9-byte header, length 0, type 4, no flags, stream 0.
const http2Preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00"

// criAnswers connects to the runtime's socket and speaks the first words of HTTP/2, on
// which gRPC (and so CRI) runs: a server must answer the preface with a SETTINGS frame.
// A stale socket file (connection refused) or a server speaking something else fails.
func criAnswers(ctx context.Context, path string) (string, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return "", fmt.Errorf("no container runtime: %s does not exist", path)
		}
		return "", fmt.Errorf("container runtime at %s does not answer: %w", path, err)
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	if _, err := io.WriteString(conn, http2Preface); err != nil {
		return "", fmt.Errorf("container runtime at %s: write: %w", path, err)
	}
	var hdr [9]byte
	if _, err := io.ReadFull(conn, hdr[:]); err != nil {
		return "", fmt.Errorf("container runtime at %s accepts connections but does not answer gRPC: %w", path, err)
	}
	if hdr[3] != 0x4 {
		return "", fmt.Errorf("container runtime at %s accepts connections but does not speak gRPC (first frame type %d, want SETTINGS)", path, hdr[3])
	}
	return path + " answers gRPC", nil
}

func portFree(ctx context.Context, host string, port int, what string) (string, error) {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", net.JoinHostPort(host, strconv.Itoa(port)))
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			return "", fmt.Errorf("port %d (%s) is in use", port, what)
		}
		return "", fmt.Errorf("port %d (%s): %w", port, what, err)
	}
	ln.Close()
	return fmt.Sprintf("port %d (%s) is free", port, what), nil
}

// swapOff reads /proc/swaps: a header line, then one line per active swap area.
func swapOff(file string) (string, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("read %s: %w", file, err)
	}
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	var areas []string
	for _, l := range lines[1:] {
		if f := strings.Fields(l); len(f) > 0 {
			areas = append(areas, f[0])
		}
	}
	if len(areas) > 0 {
		return "", fmt.Errorf("swap is on (%s); kubelet refuses to run with swap (swapoff -a, and remove it from /etc/fstab)", strings.Join(areas, ", "))
	}
	return "swap is off", nil
}

// inPath looks tool up in the PATH-style list dirs, like exec.LookPath but without
// reading the environment.
func inPath(dirs, tool string) (string, error) {
	for _, d := range filepath.SplitList(dirs) {
		if d == "" {
			continue
		}
		p := filepath.Join(d, tool)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0 {
			return tool + " is " + p, nil
		}
	}
	return "", fmt.Errorf("%s not found in PATH (%d directories searched)", tool, len(filepath.SplitList(dirs)))
}
