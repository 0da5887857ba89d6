package preflight

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kilnproject/kiln/initd/firstboot/facts"
	"github.com/kilnproject/kiln/internal/testkit"
)

// cgroup2Dir mounts a real cgroup2 filesystem in a temporary directory (root only).
func cgroup2Dir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := unix.Mount("none", dir, "cgroup2", 0, ""); err != nil {
		t.Skipf("cannot mount cgroup2 here: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	return dir
}

// grpcSocket serves HTTP/2 without TLS on a unix socket, as a gRPC server (containerd)
// does, using net/http's own HTTP/2 server.
func grpcSocket(t *testing.T) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "containerd.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Protocols: new(http.Protocols)}
	srv.Protocols.SetUnencryptedHTTP2(true)
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return sock
}

// goodOptions describes a machine on which every check passes.
func goodOptions(t *testing.T) Options {
	t.Helper()
	root, proc, bin := t.TempDir(), t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(proc, "swaps"), []byte("Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tool := range []string{"ip", "iptables", "mount", "nsenter"} {
		if err := os.WriteFile(filepath.Join(bin, tool), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// A fresh etcd volume: only lost+found.
	if err := os.MkdirAll(filepath.Join(root, "var/lib/etcd/lost+found"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(root, "etc/kubernetes/manifests"), 0o755); err != nil {
		t.Fatal(err)
	}
	p := testkit.FreePorts(t, 6)
	return Options{
		Root:       root,
		ProcRoot:   proc,
		Facts:      &facts.Facts{Hostname: "node-1", CPUs: 2, MemoryMB: 1700},
		CgroupDir:  cgroup2Dir(t),
		CRISocket:  grpcSocket(t),
		Path:       "/nonexistent:" + bin,
		Ports:      ports{p[0], p[1], p[2], p[3], p[4], p[5]},
		ListenHost: "",
		EUID:       func() int { return 0 },
	}
}

func names(rep Report) []string {
	var out []string
	for _, r := range rep.Results {
		out = append(out, r.Name)
	}
	return out
}

func TestRunAllPass(t *testing.T) {
	o := goodOptions(t)
	pn := func(p int) string { return "port-" + strconv.Itoa(p) }
	common := []string{"root"}
	tail := []string{"manifests-dir"}
	want := map[Role][]string{
		ControlPlane: append(append(common, "cpus", "memory", "cgroup-v2", "cri-socket", "hostname",
			pn(o.Ports.APIServer), pn(o.Ports.Scheduler), pn(o.Ports.ControllerManager), pn(o.Ports.Kubelet),
			pn(o.Ports.EtcdClient), pn(o.Ports.EtcdPeer)), append(tail, "etcd-data-dir", "swap", "path-ip", "path-iptables", "path-mount", "path-nsenter")...),
		Worker: append(append(common, "cgroup-v2", "cri-socket", "hostname", pn(o.Ports.Kubelet)),
			append(tail, "swap", "path-ip", "path-iptables", "path-mount", "path-nsenter")...),
		Etcd: append(append(common, "cpus", "memory", "cgroup-v2", "cri-socket", "hostname",
			pn(o.Ports.Kubelet), pn(o.Ports.EtcdClient), pn(o.Ports.EtcdPeer)),
			append(tail, "etcd-data-dir", "swap", "path-ip", "path-iptables", "path-mount", "path-nsenter")...),
	}
	for role, wantNames := range want {
		t.Run(string(role), func(t *testing.T) {
			rep, err := Run(context.Background(), role, o)
			if err != nil {
				t.Fatal(err)
			}
			if got := names(rep); !reflect.DeepEqual(got, wantNames) {
				t.Errorf("checks for %s:\n got %v\nwant %v", role, got, wantNames)
			}
			for _, r := range rep.Results {
				if r.Status != Pass || r.Message == "" {
					t.Errorf("%s: %s %q, want pass with a message", r.Name, r.Status, r.Message)
				}
			}
			if err := rep.Err(); err != nil {
				t.Errorf("Err() = %v", err)
			}
		})
	}
}

// runFailureCase is a change to a healthy node and the check that must fail on it.
type runFailureCase struct {
	name      string
	role      Role
	change    func(t *testing.T, o *Options)
	check     string
	severity  Severity
	wantInMsg string
}

var runFailureCases = []runFailureCase{
	{"not root", Worker, func(_ *testing.T, o *Options) { o.EUID = func() int { return 1000 } }, "root", Error, "user id 1000"},
	{"one CPU", ControlPlane, func(_ *testing.T, o *Options) { o.Facts.CPUs = 1 }, "cpus", Error, "1 CPU(s) available; at least 2"},
	{"one CPU on etcd warns", Etcd, func(_ *testing.T, o *Options) { o.Facts.CPUs = 1 }, "cpus", Warning, "at least 2"},
	{"too little memory", ControlPlane, func(_ *testing.T, o *Options) { o.Facts.MemoryMB = 1699 }, "memory", Error, "1699 MB"},
	{"cgroup v1", Worker, func(t *testing.T, o *Options) { o.CgroupDir = t.TempDir() }, "cgroup-v2", Error, "not the unified cgroup v2 hierarchy"},
	{"no runtime on a control plane", ControlPlane, func(t *testing.T, o *Options) { o.CRISocket = filepath.Join(t.TempDir(), "none.sock") }, "cri-socket", Error, "does not exist"},
	{"no runtime on a worker warns", Worker, func(t *testing.T, o *Options) { o.CRISocket = filepath.Join(t.TempDir(), "none.sock") }, "cri-socket", Warning, "does not exist"},
	{"stale runtime socket", ControlPlane, func(t *testing.T, o *Options) {
		sock := filepath.Join(t.TempDir(), "stale.sock")
		ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		ln.SetUnlinkOnClose(false)
		ln.Close()
		o.CRISocket = sock
	}, "cri-socket", Error, "does not answer"},
	{"socket speaking HTTP/1", ControlPlane, func(t *testing.T, o *Options) {
		sock := filepath.Join(t.TempDir(), "h1.sock")
		ln, err := net.Listen("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		srv := &http.Server{} // HTTP/1 only: answers the preface with 400 Bad Request
		go srv.Serve(ln)
		t.Cleanup(func() { srv.Close() })
		o.CRISocket = sock
	}, "cri-socket", Error, "does not speak gRPC"},
	{"bad hostname", Etcd, func(_ *testing.T, o *Options) { o.Facts.Hostname = "Node_1" }, "hostname", Error, `"Node_1"`},
	{"apiserver port taken", ControlPlane, func(t *testing.T, o *Options) { o.Ports.APIServer = testkit.HoldPort(t, "127.0.0.1") }, "port-", Error, "(kube-apiserver) is in use"},
	{"kubelet port taken on all addresses", Worker, func(t *testing.T, o *Options) { o.Ports.Kubelet = testkit.HoldPort(t, "") }, "port-", Error, "(kubelet) is in use"},
	{"manifests present", Worker, func(t *testing.T, o *Options) {
		write(t, filepath.Join(o.Root, "etc/kubernetes/manifests/kube-apiserver.yaml"), 0o600)
	}, "manifests-dir", Error, "/etc/kubernetes/manifests is not empty: kube-apiserver.yaml"},
	{"etcd data present", Etcd, func(t *testing.T, o *Options) {
		write(t, filepath.Join(o.Root, "var/lib/etcd/member/snap/db"), 0o600)
	}, "etcd-data-dir", Error, "/var/lib/etcd is not empty: member"},
	{"swap on", Worker, func(t *testing.T, o *Options) {
		os.WriteFile(filepath.Join(o.ProcRoot, "swaps"), []byte("Filename Type Size Used Priority\n/dev/vda3 partition 1048572 0 -2\n"), 0o644)
	}, "swap", Error, "swap is on (/dev/vda3)"},
	{"nsenter missing", Worker, func(_ *testing.T, o *Options) { os.Remove(filepath.Join(filepath.SplitList(o.Path)[1], "nsenter")) }, "path-nsenter", Error, "nsenter not found in PATH"},
	{"ip not executable", Worker, func(_ *testing.T, o *Options) { os.Chmod(filepath.Join(filepath.SplitList(o.Path)[1], "ip"), 0o644) }, "path-ip", Error, "ip not found"},
}

func TestRunFailures(t *testing.T) {
	for _, tc := range runFailureCases {
		t.Run(tc.name, func(t *testing.T) {
			o := goodOptions(t)
			tc.change(t, &o)
			rep, err := Run(context.Background(), tc.role, o)
			if err != nil {
				t.Fatal(err)
			}
			var failed []Result
			for _, r := range rep.Results {
				if r.Status != Pass {
					failed = append(failed, r)
				}
			}
			if len(failed) != 1 || !strings.HasPrefix(failed[0].Name, tc.check) {
				t.Fatalf("failed checks = %+v, want only %s", failed, tc.check)
			}
			f := failed[0]
			if f.Status != Fail || f.Severity != tc.severity || !strings.Contains(f.Message, tc.wantInMsg) {
				t.Errorf("result = %+v, want %s %s containing %q", f, Fail, tc.severity, tc.wantInMsg)
			}
			err = rep.Err()
			if (err != nil) != (tc.severity == Error) {
				t.Errorf("Err() = %v for a failed %s check", err, tc.severity)
			}
			if err != nil && !strings.Contains(err.Error(), f.Name+": "+f.Message) {
				t.Errorf("Err() = %v, want it to name %s", err, f.Name)
			}
		})
	}
}

func write(t *testing.T, p string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte("x"), mode); err != nil {
		t.Fatal(err)
	}
}

func TestSkipAndIgnore(t *testing.T) {
	o := goodOptions(t)
	o.EUID = func() int { return 1000 }
	o.Facts.CPUs = 1
	o.Skip = []string{"cpus"}
	o.Ignore = []string{"root"}
	rep, err := Run(context.Background(), ControlPlane, o)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]Result{}
	for _, r := range rep.Results {
		got[r.Name] = r
	}
	if r := got["cpus"]; r.Status != Skip {
		t.Errorf("cpus = %+v, want skipped", r)
	}
	if r := got["root"]; r.Status != Fail || !r.Ignored {
		t.Errorf("root = %+v, want an ignored failure", r)
	}
	if err := rep.Err(); err != nil {
		t.Errorf("Err() = %v, want nil: the only failure is ignored", err)
	}
	var buf bytes.Buffer
	rep.Print(&buf, "table")
	for _, want := range []string{"root  ", "ignored", "skipped", "preflight for control-plane: 17 passed, 1 warning(s), 0 error(s), 1 skipped"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, buf.String())
		}
	}
}

func TestGatherFailureIsACheck(t *testing.T) {
	o := goodOptions(t)
	o.Facts = nil
	o.SysRoot = t.TempDir() // no CPU list, no interfaces
	rep, err := Run(context.Background(), Worker, o)
	if err != nil {
		t.Fatal(err)
	}
	if r := rep.Results[0]; r.Name != "facts" || r.Status != Fail || !strings.Contains(r.Message, "online CPUs") {
		t.Errorf("first result = %+v, want the failed facts check", r)
	}
	if rep.Err() == nil {
		t.Error("Err() = nil despite unreadable facts")
	}
}

func TestPrint(t *testing.T) {
	rep := Report{Role: Worker, Results: []Result{
		{Name: "root", Severity: Error, Status: Pass, Message: "running as root"},
		{Name: "cri-socket", Severity: Warning, Status: Fail, Message: "no container runtime"},
		{Name: "swap", Severity: Error, Status: Fail, Message: "swap is on (/dev/vda3)"},
	}}
	var buf bytes.Buffer
	if err := rep.Print(&buf, "table"); err != nil {
		t.Fatal(err)
	}
	want := "CHECK       SEVERITY  RESULT   MESSAGE\n" +
		"root        error     ok       running as root\n" +
		"cri-socket  warning   WARNING  no container runtime\n" +
		"swap        error     ERROR    swap is on (/dev/vda3)\n" +
		"preflight for worker: 1 passed, 1 warning(s), 1 error(s), 0 skipped\n"
	if buf.String() != want {
		t.Errorf("table:\n%s\nwant:\n%s", buf.String(), want)
	}
	buf.Reset()
	if err := rep.Print(&buf, "json"); err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(buf.Bytes(), &back); err != nil || !reflect.DeepEqual(back, rep) {
		t.Errorf("JSON round trip: %v\n%s", err, buf.String())
	}
	if !strings.Contains(buf.String(), `"status": "fail"`) {
		t.Errorf("JSON lacks the status field:\n%s", buf.String())
	}
	if err := rep.Print(&buf, "yaml"); err == nil {
		t.Error("Print yaml: no error")
	}
	if err := rep.Err(); err == nil || err.Error() != "preflight for worker: 1 check(s) failed: swap: swap is on (/dev/vda3)" {
		t.Errorf("Err() = %v", err)
	}
}

// TestRunThisMachine runs the real checks against this machine. What this machine is
// (its CPUs, cgroup layout, tools) is not asserted; what the test controls is.
func TestRunThisMachine(t *testing.T) {
	// Hold the kubelet port, if it is free, so that check's outcome is known.
	held := false
	if ln, err := net.Listen("tcp", ":10250"); err == nil {
		held = true
		defer ln.Close()
	}
	rep, err := Run(context.Background(), ControlPlane, Options{})
	if err != nil {
		t.Fatal(err)
	}
	f, _ := facts.Gather(context.Background(), facts.Options{})
	got := map[string]Result{}
	for _, r := range rep.Results {
		if r.Status != Pass && r.Status != Fail || r.Message == "" || r.Severity != Error {
			t.Errorf("malformed result %+v", r)
		}
		got[r.Name] = r
	}
	for _, name := range []string{"root", "cpus", "memory", "cgroup-v2", "cri-socket", "hostname", "port-6443", "port-10259",
		"port-10257", "port-10250", "port-2379", "port-2380", "manifests-dir", "etcd-data-dir", "swap",
		"path-ip", "path-iptables", "path-mount", "path-nsenter"} {
		if _, ok := got[name]; !ok {
			t.Errorf("no %s check in %v", name, names(rep))
		}
	}
	if want := os.Geteuid() == 0; (got["root"].Status == Pass) != want {
		t.Errorf("root = %+v, euid %d", got["root"], os.Geteuid())
	}
	if want := f.CPUs >= 2; (got["cpus"].Status == Pass) != want {
		t.Errorf("cpus = %+v with %d CPUs", got["cpus"], f.CPUs)
	}
	if want := f.MemoryMB >= 1700; (got["memory"].Status == Pass) != want {
		t.Errorf("memory = %+v with %d MB", got["memory"], f.MemoryMB)
	}
	if held && got["port-10250"].Status != Fail {
		t.Errorf("port-10250 = %+v while the test holds it", got["port-10250"])
	}
	var buf bytes.Buffer
	if err := rep.Print(&buf, "table"); err != nil {
		t.Fatal(err)
	}
	t.Logf("this machine:\n%s", buf.String())
}
