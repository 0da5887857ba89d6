// Package preflight checks that a machine can become a Kubernetes node of a given role
// before first boot configures it: kubeadm's list (root, CPUs, memory, cgroup v2, a
// container runtime that answers, an RFC 1123 hostname, free ports, empty manifests and
// etcd directories, swap off, tools on PATH). Each check has a severity per role;
// failed error-level checks stop the role's path, warnings are only reported.
package preflight

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kilnproject/kiln/initd/firstboot/facts"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

// Role is what a node becomes.
type Role string

// The roles kiln builds.
const (
	ControlPlane Role = "control-plane"
	Worker       Role = "worker"
	Etcd         Role = "etcd"
)

// ParseRole returns the role named s.
func ParseRole(s string) (Role, error) {
	switch r := Role(s); r {
	case ControlPlane, Worker, Etcd:
		return r, nil
	}
	return "", fmt.Errorf("unknown role %q (want control-plane, worker or etcd)", s)
}

// Severity says what a failed check means for the role.
type Severity string

const (
	// Error stops the role's path.
	Error Severity = "error"
	// Warning is reported and nothing more.
	Warning Severity = "warning"
)

// Status is a check's outcome.
type Status string

const (
	Pass Status = "pass"
	Fail Status = "fail"
	Skip Status = "skip" // named in Options.Skip: not run
)

// Result is one check's outcome.
type Result struct {
	Name     string   `json:"name"`
	Severity Severity `json:"severity"`
	Status   Status   `json:"status"`
	// Ignored is set on a failure named in Options.Ignore: reported, but Err leaves it out.
	Ignored bool   `json:"ignored,omitempty"`
	Message string `json:"message"`
}

// blocking reports whether the result stops the role's path.
func (r Result) blocking() bool { return r.Status == Fail && r.Severity == Error && !r.Ignored }

// Report is the outcome of Run.
type Report struct {
	Role    Role     `json:"role"`
	Results []Result `json:"results"`
}

// ports are the TCP ports the checks probe; zero fields take kubeadm's defaults.
type ports struct {
	APIServer         int // 6443
	Scheduler         int // 10259
	ControllerManager int // 10257
	Kubelet           int // 10250
	EtcdClient        int // 2379
	EtcdPeer          int // 2380
}

// Options make every input of the checks replaceable. The zero value checks the
// running machine.
type Options struct {
	// Root is the node's root; the manifests and etcd data directories are looked up
	// below it. "" means "/".
	Root string
	// ProcRoot and SysRoot are where proc and sysfs are mounted; "" means /proc, /sys.
	ProcRoot, SysRoot string
	// Facts are the machine's facts; nil gathers them (facts.Gather with Root,
	// ProcRoot, SysRoot); a gathering error becomes the failed check "facts".
	Facts *facts.Facts
	// Hostname is the node name to check; "" means Facts.Hostname.
	Hostname string
	// CgroupDir must be the unified cgroup v2 hierarchy; "" means /sys/fs/cgroup.
	CgroupDir string
	// CRISocket is the container runtime's socket; "" means
	// /run/containerd/containerd.sock.
	CRISocket string
	// ManifestsDir and EtcdDataDir are node paths (below Root); "" means
	// /etc/kubernetes/manifests and /var/lib/etcd.
	ManifestsDir, EtcdDataDir string
	// Path is searched for the required tools (its directories are host paths, not
	// below Root); "" means $PATH, or the standard sbin/bin list when that is empty.
	Path string
	// Ports are the ports to probe; ListenHost is the address to bind them on ("" is
	// every address, as the components bind).
	Ports      ports
	ListenHost string
	// EUID returns the effective user id; nil means os.Geteuid.
	EUID func() int
	// Skip names checks not to run; Ignore names checks whose failure is reported but
	// does not count (kubeadm's --ignore-preflight-errors). "all" matches every check.
	Skip, Ignore []string
	// Timeout bounds each check; 0 means 5s.
	Timeout time.Duration
}

const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

func (o Options) withDefaults() Options {
	def := func(s *string, v string) {
		if *s == "" {
			*s = v
		}
	}
	def(&o.Root, "/")
	def(&o.ProcRoot, "/proc")
	def(&o.SysRoot, "/sys")
	def(&o.CgroupDir, "/sys/fs/cgroup")
	def(&o.CRISocket, nodeimage.ContainerdSocket)
	def(&o.ManifestsDir, nodeimage.ManifestsDir)
	def(&o.EtcdDataDir, nodeimage.EtcdDataDir)
	def(&o.Path, os.Getenv("PATH"))
	def(&o.Path, defaultPath)
	defPort := func(p *int, v int) {
		if *p == 0 {
			*p = v
		}
	}
	defPort(&o.Ports.APIServer, 6443)
	defPort(&o.Ports.Scheduler, 10259)
	defPort(&o.Ports.ControllerManager, 10257)
	defPort(&o.Ports.Kubelet, 10250)
	defPort(&o.Ports.EtcdClient, 2379)
	defPort(&o.Ports.EtcdPeer, 2380)
	if o.EUID == nil {
		o.EUID = os.Geteuid
	}
	if o.Timeout == 0 {
		o.Timeout = 5 * time.Second
	}
	return o
}

// Run runs the checks that apply to role, in table order, and reports every outcome.
// It returns an error only for an unknown role; failed checks are in the Report.
func Run(ctx context.Context, role Role, opts Options) (Report, error) {
	if _, err := ParseRole(string(role)); err != nil {
		return Report{}, fmt.Errorf("preflight: %w", err)
	}
	o := opts.withDefaults()
	rep := Report{Role: role, Results: []Result{}}
	var gatherErr error
	if o.Facts == nil {
		o.Facts, gatherErr = facts.Gather(ctx, facts.Options{Root: o.Root, ProcRoot: o.ProcRoot, SysRoot: o.SysRoot})
		if o.Facts == nil {
			o.Facts = &facts.Facts{}
		}
	}
	if gatherErr != nil {
		rep.Results = append(rep.Results, Result{Name: "facts", Severity: Error, Status: Fail, Message: gatherErr.Error(),
			Ignored: matches(o.Ignore, "facts")})
	}
	if o.Hostname == "" {
		o.Hostname = o.Facts.Hostname
	}
	for _, c := range table(o) {
		sev, ok := c.roles[role]
		if !ok {
			continue
		}
		r := Result{Name: c.name, Severity: sev}
		if matches(o.Skip, c.name) {
			r.Status, r.Message = Skip, "skipped on request"
			rep.Results = append(rep.Results, r)
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, o.Timeout)
		msg, err := c.run(cctx)
		cancel()
		r.Status, r.Message = Pass, msg
		if err != nil {
			r.Status, r.Message = Fail, err.Error()
			r.Ignored = matches(o.Ignore, c.name)
		}
		rep.Results = append(rep.Results, r)
	}
	return rep, nil
}

func matches(list []string, name string) bool {
	return slices.Contains(list, name) || slices.Contains(list, "all")
}

// Err returns an error naming every failed error-level check that is not ignored, or
// nil when the role's path may go on.
func (r Report) Err() error {
	var msgs []string
	for _, res := range r.Results {
		if res.blocking() {
			msgs = append(msgs, res.Name+": "+res.Message)
		}
	}
	if len(msgs) == 0 {
		return nil
	}
	return fmt.Errorf("preflight for %s: %d check(s) failed: %s", r.Role, len(msgs), strings.Join(msgs, "; "))
}

// summary is one line: "preflight for worker: 12 passed, 1 warning, 0 errors, 0 skipped".
func (r Report) summary() string {
	var pass, warn, fail, skip int
	for _, res := range r.Results {
		switch {
		case res.Status == Pass:
			pass++
		case res.Status == Skip:
			skip++
		case res.blocking():
			fail++
		default:
			warn++
		}
	}
	return fmt.Sprintf("preflight for %s: %d passed, %d warning(s), %d error(s), %d skipped", r.Role, pass, warn, fail, skip)
}

// outcome is the RESULT column of the table.
func (r Result) outcome() string {
	switch {
	case r.Status == Pass:
		return "ok"
	case r.Status == Skip:
		return "skipped"
	case r.Ignored:
		return "ignored"
	case r.Severity == Error:
		return "ERROR"
	default:
		return "WARNING"
	}
}

// Print writes the report as a table (format "table" or "") followed by the summary
// line, or as indented JSON (format "json").
func (r Report) Print(w io.Writer, format string) error {
	switch format {
	case "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(r)
	case "", "table":
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "CHECK\tSEVERITY\tRESULT\tMESSAGE")
		for _, res := range r.Results {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", res.Name, res.Severity, res.outcome(), res.Message)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		_, err := fmt.Fprintln(w, r.summary())
		return err
	}
	return fmt.Errorf("unknown output format %q (want table or json)", format)
}

// dirEmpty passes when dir (a node path below root) is absent or holds nothing but the
// names in allowed (lost+found on a dedicated volume).
func dirEmpty(root, dir string, allowed ...string) (string, error) {
	ents, err := os.ReadDir(filepath.Join(root, dir))
	switch {
	case errors.Is(err, os.ErrNotExist):
		return dir + " does not exist", nil
	case err != nil:
		return "", fmt.Errorf("read %s: %w", dir, err)
	}
	var names []string
	for _, e := range ents {
		if !slices.Contains(allowed, e.Name()) {
			names = append(names, e.Name())
		}
	}
	if len(names) == 0 {
		return dir + " is empty", nil
	}
	more := ""
	if len(names) > 3 {
		names, more = names[:3], fmt.Sprintf(" and %d more", len(names)-3)
	}
	return "", fmt.Errorf("%s is not empty: %s%s", dir, strings.Join(names, ", "), more)
}
