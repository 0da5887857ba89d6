package qemutests

import (
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

// kubectlFunc runs kubectl against the e2e cluster and returns its trimmed output.
type kubectlFunc func(args ...string) (string, error)

// diagnose logs where the cluster's time went — kube-system's pods, warning events, CPU
// seconds per pod and system container on each node, etcd's slow-request warnings — and fails
// the test if any kube-system container restarted: a converged control plane that restarted
// on the way (lost leader leases, a failed post-start hook, probes) is thrashing.
func diagnose(t *testing.T, kubectl kubectlFunc, nodes ...string) {
	t.Helper()
	pods, _ := kubectl("get", "pods", "-n", "kube-system", "-o", "wide")
	t.Logf("e2e: pods in kube-system:\n%s", pods)
	events, _ := kubectl("get", "events", "-n", "kube-system", "--field-selector", "type=Warning", "-o",
		`jsonpath={range .items[*]}{.involvedObject.name}: {.reason}: {.message}{"\n"}{end}`)
	t.Logf("e2e: warning events in kube-system:\n%s", lastN(events, 25))
	for _, node := range nodes {
		logNodeCPU(t, kubectl, node)
	}
	if len(nodes) > 0 {
		logEtcdLatency(t, kubectl, "etcd-"+nodes[0])
	}
	if n := reportRestarts(t, kubectl); n > 0 {
		t.Errorf("%d kube-system container restart(s) while the cluster came up (see above)", n)
	}
}

// podStatuses is the part of a pod list reportRestarts reads.
type podStatuses struct {
	Items []struct {
		Metadata struct {
			Name string `json:"name"`
		} `json:"metadata"`
		Status struct {
			ContainerStatuses []struct {
				Name         string `json:"name"`
				RestartCount int    `json:"restartCount"`
				LastState    struct {
					Terminated *struct {
						Reason   string `json:"reason"`
						ExitCode int    `json:"exitCode"`
					} `json:"terminated"`
				} `json:"lastState"`
			} `json:"containerStatuses"`
		} `json:"status"`
	} `json:"items"`
}

// reportRestarts logs every restarted kube-system container with why it last ended and the end
// of its previous log, and returns the number of restarts.
func reportRestarts(t *testing.T, kubectl kubectlFunc) int {
	t.Helper()
	out, err := kubectl("get", "pods", "-n", "kube-system", "-o", "json")
	if err != nil {
		t.Errorf("list kube-system pods: %v: %s", err, out)
		return 0
	}
	var list podStatuses
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Errorf("list kube-system pods: %v", err)
		return 0
	}
	total := 0
	for _, p := range list.Items {
		for _, c := range p.Status.ContainerStatuses {
			if c.RestartCount == 0 {
				continue
			}
			total += c.RestartCount
			last := "unknown"
			if tm := c.LastState.Terminated; tm != nil {
				last = fmt.Sprintf("%s, exit %d", tm.Reason, tm.ExitCode)
			}
			logs, _ := kubectl("logs", "-n", "kube-system", p.Metadata.Name, "-c", c.Name, "--previous", "--tail", "15")
			t.Logf("e2e: %s/%s restarted %d time(s) (last: %s); its previous log ends:\n%s",
				p.Metadata.Name, c.Name, c.RestartCount, last, logs)
		}
	}
	t.Logf("e2e: kube-system container restarts: %d", total)
	return total
}

// statsSummary is the part of kubelet's /stats/summary logNodeCPU reads.
type statsSummary struct {
	Node struct {
		CPU              cpuStats `json:"cpu"`
		SystemContainers []struct {
			Name string   `json:"name"`
			CPU  cpuStats `json:"cpu"`
		} `json:"systemContainers"`
	} `json:"node"`
	Pods []struct {
		PodRef struct {
			Name      string `json:"name"`
			Namespace string `json:"namespace"`
		} `json:"podRef"`
		CPU cpuStats `json:"cpu"`
	} `json:"pods"`
}

type cpuStats struct {
	UsageCoreNanoSeconds uint64 `json:"usageCoreNanoSeconds"`
}

// logNodeCPU logs the CPU time a node spent so far, in total, per system container (kubelet,
// the runtime) and per pod, most first: where a slow control plane's cycles went.
func logNodeCPU(t *testing.T, kubectl kubectlFunc, node string) {
	t.Helper()
	out, err := kubectl("get", "--raw", "/api/v1/nodes/"+node+"/proxy/stats/summary")
	if err != nil {
		t.Logf("e2e: %s: no stats summary: %v: %s", node, err, lastN(out, 3))
		return
	}
	var s statsSummary
	if err := json.Unmarshal([]byte(out), &s); err != nil {
		t.Logf("e2e: %s: stats summary: %v", node, err)
		return
	}
	type row struct {
		name string
		ns   uint64
	}
	var rows []row
	for _, c := range s.Node.SystemContainers {
		rows = append(rows, row{"system/" + c.Name, c.CPU.UsageCoreNanoSeconds})
	}
	for _, p := range s.Pods {
		rows = append(rows, row{p.PodRef.Namespace + "/" + p.PodRef.Name, p.CPU.UsageCoreNanoSeconds})
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].ns > rows[j].ns })
	var b strings.Builder
	fmt.Fprintf(&b, "e2e: %s: CPU time since boot %s; by container:", node, cpuSeconds(s.Node.CPU.UsageCoreNanoSeconds))
	for _, r := range rows {
		fmt.Fprintf(&b, "\n  %-55s %s", r.name, cpuSeconds(r.ns))
	}
	t.Log(b.String())
}

func cpuSeconds(ns uint64) string {
	return (time.Duration(ns) * time.Nanosecond).Round(100 * time.Millisecond).String()
}

// etcdTook matches the duration etcd's slow-request warnings report ("took":"1.234s").
var etcdTook = regexp.MustCompile(`"took":"([0-9.]+[a-zµ]+)"`)

// logEtcdLatency counts etcd's warnings that its disk or CPU was too slow — slow fdatasync,
// requests that took longer than expected — and the longest such request.
func logEtcdLatency(t *testing.T, kubectl kubectlFunc, pod string) {
	t.Helper()
	out, err := kubectl("logs", "-n", "kube-system", pod)
	if err != nil {
		t.Logf("e2e: %s: no log: %v", pod, err)
		return
	}
	counts := map[string]int{}
	var longest time.Duration
	for _, line := range strings.Split(out, "\n") {
		for _, w := range []string{"slow fdatasync", "apply request took too long", "leader failed to send out heartbeat", "waiting for ReadIndex response took too long"} {
			if strings.Contains(line, w) {
				counts[w]++
			}
		}
		if m := etcdTook.FindStringSubmatch(line); m != nil {
			if d, err := time.ParseDuration(m[1]); err == nil && d > longest {
				longest = d
			}
		}
	}
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k+": "+strconv.Itoa(counts[k]))
	}
	sort.Strings(keys)
	t.Logf("e2e: %s: slow-operation warnings {%s}, longest reported request %s", pod, strings.Join(keys, ", "), longest)
}

// timelineObjects is the part of the objects logTimeline reads.
type timelineObjects struct {
	Items []struct {
		Metadata struct {
			Name              string    `json:"name"`
			CreationTimestamp time.Time `json:"creationTimestamp"`
		} `json:"metadata"`
		Spec struct {
			NodeName    string     `json:"nodeName"`
			AcquireTime *time.Time `json:"acquireTime"`
		} `json:"spec"`
		Status struct {
			Conditions []struct {
				Type               string    `json:"type"`
				Status             string    `json:"status"`
				LastTransitionTime time.Time `json:"lastTransitionTime"`
			} `json:"conditions"`
			ContainerStatuses []struct {
				Name  string `json:"name"`
				State struct {
					Running *struct {
						StartedAt time.Time `json:"startedAt"`
					} `json:"running"`
				} `json:"state"`
				LastState struct {
					Terminated *struct {
						StartedAt time.Time `json:"startedAt"`
					} `json:"terminated"`
				} `json:"lastState"`
			} `json:"containerStatuses"`
		} `json:"status"`
	} `json:"items"`
}

// logTimeline logs, in order and from start (the VM's start on the host), what the API
// server records of a control plane's first minutes (in the node's clock, which the VM took
// from the host's): each kube-system container of the node started (its first start), each
// of their pods Ready, the node registered and Ready, admin.conf's group bound to
// cluster-admin (until then the cluster refuses admin.conf) and the leader leases taken.
func logTimeline(t *testing.T, kubectl kubectlFunc, node string, start time.Time) {
	t.Helper()
	type event struct {
		at   time.Time
		what string
	}
	var events []event
	add := func(at time.Time, what string) {
		if !at.IsZero() {
			events = append(events, event{at, what})
		}
	}
	get := func(args ...string) timelineObjects {
		var objs timelineObjects
		out, err := kubectl(append(args, "-o", "json")...)
		if err == nil {
			err = json.Unmarshal([]byte(out), &objs)
		}
		if err != nil {
			t.Logf("e2e: timeline: kubectl %s: %v", strings.Join(args, " "), err)
		}
		return objs
	}
	for _, p := range get("get", "pods", "-n", "kube-system").Items {
		if p.Spec.NodeName != node {
			continue
		}
		for _, c := range p.Status.ContainerStatuses {
			at := time.Time{}
			if c.State.Running != nil {
				at = c.State.Running.StartedAt
			}
			if c.LastState.Terminated != nil {
				at = c.LastState.Terminated.StartedAt
			}
			add(at, "container "+c.Name+" started")
		}
		for _, c := range p.Status.Conditions {
			if c.Type == "Ready" && c.Status == "True" {
				add(c.LastTransitionTime, "pod "+p.Metadata.Name+" Ready")
			}
		}
	}
	for _, n := range get("get", "nodes").Items {
		if n.Metadata.Name != node {
			continue
		}
		add(n.Metadata.CreationTimestamp, "node registered")
		for _, c := range n.Status.Conditions {
			if c.Type == "Ready" && c.Status == "True" {
				add(c.LastTransitionTime, "node Ready")
			}
		}
	}
	for _, b := range get("get", "clusterrolebindings").Items {
		if b.Metadata.Name == "kubeadm:cluster-admins" {
			add(b.Metadata.CreationTimestamp, "kubeadm:cluster-admins bound (admin.conf usable)")
		}
	}
	for _, l := range get("get", "leases", "-n", "kube-system").Items {
		if l.Spec.AcquireTime != nil && (l.Metadata.Name == "kube-scheduler" || l.Metadata.Name == "kube-controller-manager") {
			add(*l.Spec.AcquireTime, "lease "+l.Metadata.Name+" taken")
		}
	}
	sort.SliceStable(events, func(i, j int) bool { return events[i].at.Before(events[j].at) })
	var b strings.Builder
	fmt.Fprintf(&b, "e2e: %s: timeline from the VM's start (node clock):", node)
	for _, e := range events {
		fmt.Fprintf(&b, "\n  %8s  %s", e.at.Sub(start).Round(time.Second), e.what)
	}
	t.Log(b.String())
}
