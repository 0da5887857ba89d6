package qemucluster

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/kilnproject/kiln/internal/nodeimage"
)

// NodeStatus is one node as `kiln cluster status` shows it.
type NodeStatus struct {
	Name    string `json:"name"`
	Role    string `json:"role"`
	Running bool   `json:"running"`
	PID     int    `json:"pid,omitempty"`
	Address string `json:"address"`
	APIPort int    `json:"apiPort,omitempty"`
	// EtcdEndpoint is the host's client URL of the node's etcd member.
	EtcdEndpoint string `json:"etcdEndpoint,omitempty"`
	// SSH is the command that logs in as root on the node (up --ssh-key).
	SSH string `json:"ssh,omitempty"`
	// FirstBoot is the last first-boot status line's outcome and detail, "" before one.
	FirstBoot string `json:"firstBoot"`
	// Etcd is what the latest boot said of the node's etcd member (a member of several):
	// "voting", "failed: …", "" before it said anything.
	Etcd string `json:"etcd,omitempty"`
	// Ready is the node's Ready condition, "" when the API does not answer or lacks the node.
	Ready string `json:"ready"`
	// Restarts are the node's kube-system container restarts, as the API reports them (nil
	// when it does not answer; an etcd node's pods are not in the API).
	Restarts *Restarts `json:"restarts,omitempty"`
	// RSSMiB and CPUSeconds are the QEMU process's resident memory and CPU time so far.
	RSSMiB     int64   `json:"rssMiB,omitempty"`
	CPUSeconds float64 `json:"cpuSeconds,omitempty"`
	Console    string  `json:"console"`
}

// Status is the cluster's nodes; APIError says why Ready is unknown.
type Status struct {
	Name       string       `json:"name"`
	StateDir   string       `json:"stateDir"`
	Kubeconfig string       `json:"kubeconfig"`
	Nodes      []NodeStatus `json:"nodes"`
	APIError   string       `json:"apiError,omitempty"`
	// Etcd is what the members say, through their forwarded client ports.
	Etcd *EtcdState `json:"etcd,omitempty"`
}

// Status looks at every node: its QEMU, its console and, through the API, its Ready.
func (s *State) Status(ctx context.Context) Status {
	st := Status{Name: s.Name, StateDir: s.Dir, Kubeconfig: s.Kubeconfig()}
	var ready map[string]readyCondition
	var restarts map[string]Restarts
	if api, err := s.apiClient(); err != nil {
		st.APIError = err.Error()
	} else {
		rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		ready, err = api.nodeReady(rctx)
		if err == nil {
			restarts, err = api.restarts(rctx)
		}
		cancel()
		if err != nil {
			st.APIError = err.Error()
		}
	}
	for _, n := range s.Nodes {
		c := s.console(n.Name)
		ns := NodeStatus{Name: n.Name, Role: n.Role, Address: n.Address, APIPort: n.APIPort, EtcdEndpoint: n.EtcdEndpoint(), SSH: n.sshCommand(),
			FirstBoot: c.FirstBoot, Etcd: c.Etcd, Ready: ready[n.Name].Status, Console: s.ConsoleLog(n.Name)}
		if r, ok := restarts[n.Name]; ok || (restarts != nil && n.Role != RoleEtcd) {
			ns.Restarts = &r
		}
		if pid := s.Running(n.Name); pid != 0 {
			ns.Running, ns.PID = true, pid
			ns.RSSMiB, ns.CPUSeconds = procUsage(pid)
		}
		st.Nodes = append(st.Nodes, ns)
	}
	st.Etcd = s.Etcd(ctx)
	return st
}

// bootConsole is what the latest boot of a node printed on its console that kiln cluster
// follows.
type bootConsole struct {
	// FirstBoot is the first-boot status line's outcome and detail, "" before one.
	FirstBoot string
	// Etcd is the etcd member line's state (etcdVoting, or "failed: …"), "" before one.
	Etcd string
}

// etcdVoting is bootConsole.Etcd of a member that votes.
const etcdVoting = nodeimage.EtcdVoting

// console reads the node's console log from its latest boot's marker on.
func (s *State) console(node string) bootConsole {
	var c bootConsole
	f, err := os.Open(s.ConsoleLog(node))
	if err != nil {
		return c
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, bootMarker) {
			c = bootConsole{}
		}
		if l, ok := nodeimage.ParseStatusLine(line); ok {
			c.FirstBoot = strings.TrimSpace(l.Outcome + " " + l.Detail)
		}
		if l, ok := nodeimage.ParseEtcdLine(line); ok {
			c.Etcd = l.State
			if l.State != nodeimage.EtcdVoting {
				c.Etcd += ": " + l.Detail
			}
		}
	}
	return c
}

func (s *State) consoleTail(node string, n int) string {
	data, err := os.ReadFile(s.ConsoleLog(node))
	if err != nil {
		return "(no console: " + err.Error() + ")"
	}
	return lastLines(string(data), n)
}

// procUsage is a process's resident memory (MiB) and CPU time (user+system, seconds) from
// /proc; zeros when unreadable.
func procUsage(pid int) (int64, float64) {
	var rss int64
	if data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid)); err == nil {
		for _, l := range strings.Split(string(data), "\n") {
			if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
				kb, _ := strconv.ParseInt(f[1], 10, 64)
				rss = kb >> 10
			}
		}
	}
	var cpu float64
	if data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil {
		if i := strings.LastIndexByte(string(data), ')'); i > 0 {
			f := strings.Fields(string(data)[i+1:])
			// After the command: state is field 0, utime 11, stime 12 (clock ticks).
			if len(f) > 12 {
				ut, _ := strconv.ParseFloat(f[11], 64)
				stime, _ := strconv.ParseFloat(f[12], 64)
				cpu = (ut + stime) / clockTicks
			}
		}
	}
	return rss, cpu
}

// clockTicks is USER_HZ, 100 on Linux.
const clockTicks = 100

// sshCommand logs in as root on node n through its forwarded port; "" without one. The host
// key is new on every fresh node, so the command does not record it.
func (n Node) sshCommand() string {
	if n.SSHPort == 0 {
		return ""
	}
	return "ssh " + strings.Join(n.sshLogin(), " ") + " root@127.0.0.1"
}

// sshLogin are ssh's options that reach node n's forwarded ssh server without recording its
// host key, which is new on every fresh node.
func (n Node) sshLogin() []string {
	return []string{"-p", strconv.Itoa(n.SSHPort), "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null"}
}
