package firstboot

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kilnproject/kiln/initd/apply"
	"github.com/kilnproject/kiln/initd/config"
	"github.com/kilnproject/kiln/initd/task"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

// StatusMode is the status file's mode: it lists the SHA-256 of every file the config
// wrote, secrets included, and a digest of a short secret gives the secret away.
const StatusMode = 0o600

// States of a first boot.
const (
	StateOK     = "ok"
	StateFailed = "failed"
	// StateRunning is recorded while first boot waits for a fact its tasks need (see
	// Status.Waiting); a boot that ends in it (power cut) runs first boot again.
	StateRunning = "running"
	// StateRebooting is recorded when first boot wrote the config's kernelArguments into the
	// booted slot's boot entry and asked for a reboot: the next boot runs first boot again,
	// from the start, with the arguments in effect.
	StateRebooting = "rebooting"
)

// Status is the first-boot report, stored as JSON at nodeimage.StatusPath.
type Status struct {
	State      string    `json:"state"`
	Started    time.Time `json:"started"`
	Finished   time.Time `json:"finished"`
	DurationMS int64     `json:"duration_ms"`
	Source     string    `json:"source"`
	// Referenced are the configs the config referenced (ignition.config.merge and replace),
	// in the order first boot followed them; a data: URL is "data: URL".
	Referenced []string `json:"referenced,omitempty"`
	Platform   string   `json:"platform,omitempty"`
	Role       string   `json:"role,omitempty"`
	Hostname   string   `json:"hostname,omitempty"`
	// HostnameSource says where the hostname came from: config, platform (the metadata
	// service), kernel or generated.
	HostnameSource string `json:"hostnameSource,omitempty"`
	// InstanceID and Zone are the instance's on a cloud platform, from its metadata service.
	InstanceID string       `json:"instanceID,omitempty"`
	Zone       string       `json:"zone,omitempty"`
	Files      []FileStatus `json:"files"`
	// KernelArguments is what first boot did for the config's kernelArguments (nil when it
	// has none).
	KernelArguments *KernelArgsStatus `json:"kernelArguments,omitempty"`
	// Tasks are the task graph's outcome, in the order they ran.
	Tasks []task.TaskStatus `json:"tasks,omitempty"`
	// Waiting is what first boot is waiting for, while it waits (State running).
	Waiting *task.Wait `json:"waiting,omitempty"`
	// Waits are first boot's waits for facts its tasks lacked (the node's address).
	Waits   []task.Wait `json:"waits,omitempty"`
	Error   string      `json:"error,omitempty"`
	Version string      `json:"version"`

	// Skipped is set by Run when an earlier boot already succeeded; it is not stored.
	Skipped bool `json:"-"`
}

// FileStatus records one file that the config wrote.
type FileStatus struct {
	Path   string `json:"path"`
	SHA256 string `json:"sha256"`
	Mode   string `json:"mode"`
}

// Duration is how long the first boot took, to the millisecond.
func (s *Status) Duration() time.Duration {
	return time.Duration(s.DurationMS) * time.Millisecond
}

// Line is the one console line that tells the outcome, e.g.
// "kiln-init: firstboot ok source=fw_cfg files=2 duration=35ms".
func (s *Status) Line() string {
	switch {
	case s.Skipped:
		return nodeimage.FormatDone(s.Finished)
	case s.State == StateOK:
		return nodeimage.FormatOK(s.Source, len(s.Files), s.Summary(), s.Duration())
	case s.State == StateRebooting && s.KernelArguments != nil:
		// Not a line kiln run waits for (nodeimage.StatusLineRE): the next boot prints that.
		return nodeimage.StatusLinePrefix + StateRebooting + ": kernel arguments " + s.KernelArguments.change() +
			"; first boot goes on after the reboot"
	default:
		// The console gets the failures; the tasks they blocked are in status.json and
		// `kiln-init status`.
		var failures []string
		blocked := 0
		for _, l := range strings.Split(strings.TrimSpace(s.Error), "\n") {
			if strings.HasPrefix(l, "task ") && strings.Contains(l, " blocked: ") {
				blocked++
				continue
			}
			failures = append(failures, l)
		}
		line := nodeimage.FormatFailed(oneLine(strings.Join(failures, "\n")))
		if blocked > 0 {
			line += fmt.Sprintf(" (%d tasks blocked; see kiln-init status)", blocked)
		}
		return line
	}
}

// Summary counts the tasks by outcome, e.g. "tasks=11 applied=4 unchanged=7 failed=0".
func (s *Status) Summary() string {
	return (&task.Report{Tasks: s.Tasks}).Summary()
}

// oneLine folds a multi-line error (errors.Join) into one console line.
func oneLine(s string) string {
	s = strings.TrimSpace(s)
	if s == "" {
		return "unknown error"
	}
	return strings.Join(strings.Split(s, "\n"), "; ")
}

// ReadStatus reads the first-boot report of the node rooted at root ("" means "/").
// The error wraps fs.ErrNotExist when there is none yet.
func ReadStatus(root string) (*Status, error) {
	if root == "" {
		root = "/"
	}
	data, err := os.ReadFile(filepath.Join(root, nodeimage.StatusPath))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", nodeimage.StatusPath, err)
	}
	var st Status
	if err := json.Unmarshal(data, &st); err != nil {
		return nil, fmt.Errorf("read %s: %w", nodeimage.StatusPath, err)
	}
	return &st, nil
}

// writeStatus stores st with the appliers' safe writer (inside root, temp file, fsync, rename).
func writeStatus(ctx context.Context, root string, st *Status) error {
	data, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return fmt.Errorf("encode status: %w", err)
	}
	_, err = apply.Files(ctx, root, []config.File{{Field: "status", Path: nodeimage.StatusPath, Mode: StatusMode, ModeSet: true,
		Overwrite: true, HasContents: true, Contents: append(data, '\n')}}, nil)
	if err != nil {
		return fmt.Errorf("write %s: %w", nodeimage.StatusPath, err)
	}
	return nil
}

// tightenStatus gives a status file written by an older kiln (mode 0644) StatusMode.
func tightenStatus(root string) error {
	p := filepath.Join(root, nodeimage.StatusPath)
	fi, err := os.Lstat(p)
	if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm()&^StatusMode == 0 {
		return nil
	}
	if err := os.Chmod(p, StatusMode); err != nil {
		return fmt.Errorf("restrict %s to mode %04o: %w", nodeimage.StatusPath, StatusMode, err)
	}
	return nil
}

// PrintStatus renders a report for `kiln-init status`: format "table" (for people) or
// "json" (the stored document).
func PrintStatus(w io.Writer, st *Status, format string) error {
	switch format {
	case "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(st)
	case "table", "":
		return printTable(w, st)
	default:
		return fmt.Errorf("status format %q: want table or json", format)
	}
}

func printTable(w io.Writer, st *Status) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	row := func(k, v string) { fmt.Fprintf(tw, "%s\t%s\n", k, v) }
	row("STATE", st.State)
	row("SOURCE", orDash(st.Source))
	if len(st.Referenced) > 0 {
		row("REFERENCED", strings.Join(st.Referenced, ", "))
	}
	row("PLATFORM", orDash(st.Platform))
	row("ROLE", orDash(st.Role))
	host := orDash(st.Hostname)
	if st.HostnameSource != "" {
		host += " (from " + st.HostnameSource + ")"
	}
	row("HOSTNAME", host)
	if k := st.KernelArguments; k != nil {
		row("KERNEL ARGS", k.String())
	}
	if st.InstanceID != "" || st.Zone != "" {
		row("INSTANCE", orDash(st.InstanceID)+" in "+orDash(st.Zone))
	}
	row("STARTED", timeOrDash(st.Started))
	row("FINISHED", timeOrDash(st.Finished))
	row("DURATION", st.Duration().String())
	row("VERSION", orDash(st.Version))
	if st.Waiting != nil {
		row("WAITING", st.Waiting.String())
	}
	for _, w := range st.Waits {
		row("WAITED", waitedLine(w))
	}
	if st.Error != "" {
		row("ERROR", oneLine(st.Error))
	}
	row("TASKS", st.Summary())
	row("FILES", fmt.Sprint(len(st.Files)))
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(st.Tasks) > 0 {
		fmt.Fprintln(w)
		if err := task.WriteTable(w, st.Tasks); err != nil {
			return err
		}
	}
	if len(st.Files) == 0 {
		return nil
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PATH\tMODE\tSHA256")
	for _, f := range st.Files {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", f.Path, f.Mode, orDash(f.SHA256))
	}
	return tw.Flush()
}

// waitedLine is a finished wait, e.g. "35s for an IPv4/IPv6 address on a link (DHCP)
// (needed by facts): known".
func waitedLine(w task.Wait) string {
	outcome := "known"
	if !w.Known {
		outcome = "gave up"
	}
	return fmt.Sprintf("%s for %s (needed by %s): %s", w.Waited().Round(time.Second), w.Fact, strings.Join(w.Tasks, ", "), outcome)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func timeOrDash(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.Format(time.RFC3339)
}

// statusMissing reports whether err means "no report yet".
func statusMissing(err error) bool { return errors.Is(err, os.ErrNotExist) }
