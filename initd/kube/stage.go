package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/kilnproject/kiln/initd/task"
	"github.com/kilnproject/kiln/internal/atomicfile"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

// The stages, each run by its own unit after first boot.
const (
	StageImagesKubelet = "images-kubelet" // kiln-images.service: kiln-init kube images --for-kubelet
	StageImages        = "images"         // kiln-images-rest.service: kiln-init kube images
	StageCNI           = "cni"            // kiln-cni.service: kiln-init kube cni
	StageControlPlane  = "control-plane"  // kiln-control-plane.service: kiln-init kube bootstrap
	StageEtcdMember    = "etcd-member"    // kiln-etcd-member.service: kiln-init etcd member
)

// Stage states (Stage.State): "running" while the stage runs, then "ok" or "failed".
const (
	stateRunning = "running"
	StateOK      = "ok"
	stateFailed  = "failed"
)

// Stage is the status of one stage, stored as JSON in nodeimage.KubeStageDir.
type Stage struct {
	Name       string    `json:"name"`
	State      string    `json:"state"`
	Started    time.Time `json:"started"`
	Finished   time.Time `json:"finished,omitzero"`
	DurationMS int64     `json:"duration_ms"`
	// Progress is what the stage is doing while it runs, e.g. "task 2/8: api-ready".
	Progress string `json:"progress,omitempty"`
	// Result says what a successful stage found or did, e.g. "podCIDR 10.244.1.0/24".
	Result string            `json:"result,omitempty"`
	Error  string            `json:"error,omitempty"`
	Tasks  []task.TaskStatus `json:"tasks,omitempty"`
}

// Duration is how long the stage ran.
func (s *Stage) Duration() time.Duration { return time.Duration(s.DurationMS) * time.Millisecond }

// FailedTask names the first failed task, "" when none failed.
func (s *Stage) FailedTask() string {
	for _, t := range s.Tasks {
		if t.State == task.StateFailed {
			return t.Name
		}
	}
	return ""
}

// Failure says in one line why the stage failed: the failed tasks' errors and how many
// steps they blocked (each blocked step is in Tasks); "" for a stage that did not fail.
func (s *Stage) Failure() string {
	if s.State != stateFailed {
		return ""
	}
	var msgs []string
	blocked := 0
	for _, t := range s.Tasks {
		switch t.State {
		case task.StateFailed:
			msgs = append(msgs, t.Name+": "+strings.TrimPrefix(t.Error, "apply: "))
		case task.StateBlocked, task.StateSkipped:
			blocked++
		}
	}
	switch {
	case len(msgs) == 0:
		msgs = []string{s.Error}
	case len(msgs) == 1: // Summary and the console line name the step already
		_, msgs[0], _ = strings.Cut(msgs[0], ": ")
	}
	line := strings.Join(strings.Fields(strings.ReplaceAll(strings.Join(msgs, "; "), "\n", "; ")), " ")
	if blocked > 0 {
		line += fmt.Sprintf(" (%d later steps not run)", blocked)
	}
	return line
}

// Summary is one line: "control-plane ok 3m12s (tasks=9 applied=9 unchanged=0 failed=0) podCIDR …".
func (s *Stage) Summary() string {
	line := fmt.Sprintf("%s %s", s.Name, s.State)
	switch s.State {
	case stateRunning:
		if s.Progress != "" {
			line += ": " + s.Progress
		}
		return line
	case stateFailed:
		if t := s.FailedTask(); t != "" {
			line += " at step " + t
		}
	}
	line += " " + s.Duration().Round(time.Second).String()
	if len(s.Tasks) > 0 {
		line += " (" + (&task.Report{Tasks: s.Tasks}).Summary() + ")"
	}
	if s.Result != "" {
		line += " " + s.Result
	}
	if f := s.Failure(); f != "" {
		line += ": " + f
	}
	return line
}

// stagePath is the status file of the stage name, relative to the node's root.
func stagePath(name string) string { return filepath.Join(nodeimage.KubeStageDir, name+".json") }

// writeStage stores s under root.
func writeStage(root string, s *Stage) error {
	data, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return fmt.Errorf("stage %s: %w", s.Name, err)
	}
	p := filepath.Join(root, stagePath(s.Name))
	if err := atomicfile.Write(p, append(data, '\n'), atomicfile.Options{Mode: 0o644, DirMode: 0o755}); err != nil {
		return fmt.Errorf("stage %s: %w", s.Name, err)
	}
	return nil
}

// ReadStage reads the status of stage name; the error wraps fs.ErrNotExist when the
// stage has not run.
func ReadStage(root, name string) (*Stage, error) {
	data, err := os.ReadFile(filepath.Join(root, stagePath(name)))
	if err != nil {
		return nil, fmt.Errorf("stage %s: %w", name, err)
	}
	var s Stage
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, fmt.Errorf("stage %s: %s: %w", name, stagePath(name), err)
	}
	return &s, nil
}

// ReadStages reads every stage status under root, in the order the stages run.
func ReadStages(root string) ([]*Stage, error) {
	entries, err := os.ReadDir(filepath.Join(root, nodeimage.KubeStageDir))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("stages: %w", err)
	}
	var out []*Stage
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || e.IsDir() {
			continue
		}
		s, err := ReadStage(root, name)
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	order := []string{StageImagesKubelet, StageImages, StageEtcdMember, StageCNI, StageControlPlane}
	slices.SortStableFunc(out, func(a, b *Stage) int {
		ia, ib := slices.Index(order, a.Name), slices.Index(order, b.Name)
		if ia < 0 {
			ia = len(order)
		}
		if ib < 0 {
			ib = len(order)
		}
		return ia - ib
	})
	return out, nil
}

// PrintStages writes the stages for `kiln-init status`: one summary line each, then the
// tasks of those that have any.
func PrintStages(w io.Writer, stages []*Stage) error {
	if len(stages) == 0 {
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "STAGE\tSTATE\tSTARTED\tDURATION\tRESULT")
	for _, s := range stages {
		res := s.Result
		switch {
		case s.State == stateRunning:
			res = s.Progress
		case s.State == stateFailed:
			res = "failed"
			if t := s.FailedTask(); t != "" {
				res += " at step " + t
			}
			res += ": " + s.Failure()
		}
		if res == "" {
			res = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", s.Name, s.State, s.Started.Format(time.RFC3339), s.Duration().Round(time.Millisecond), res)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, s := range stages {
		if len(s.Tasks) == 0 {
			continue
		}
		fmt.Fprintf(w, "\n%s:\n", s.Name)
		if err := task.WriteTable(w, s.Tasks); err != nil {
			return err
		}
	}
	return nil
}

// RunOptions configure RunStage.
type RunOptions struct {
	// Root is the node's root; "" means "/".
	Root string
	// Log receives progress; nil discards it.
	Log *slog.Logger
	// now is the clock; nil means time.Now.
	now func() time.Time
	// TaskTimeout is the default per-attempt deadline; 0 means the runner's.
	TaskTimeout time.Duration
	// notify, if set, is told the progress (the caller wires it to sd_notify STATUS=).
	notify func(status string)
}

// RunStage runs tasks as the stage name, recording its status (running with the current
// task while it runs, then ok or failed with every task's outcome) in
// nodeimage.KubeStageDir so that `kiln-init status` shows it. result, when not nil, fills Stage.Result after a success.
func RunStage(ctx context.Context, name string, tasks []task.Task, o RunOptions, result func() string) (*Stage, error) {
	if o.Root == "" {
		o.Root = "/"
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.now == nil {
		o.now = time.Now
	}
	st := &Stage{Name: name, State: stateRunning, Started: o.now().UTC()}
	save := func() {
		if err := writeStage(o.Root, st); err != nil {
			o.Log.Warn("stage status", "error", err)
		}
	}
	save()
	// The runner's progress and a running task's detail (reportDetail) make st.Progress
	// together, under one lock: tasks report from their own goroutines.
	var mu sync.Mutex
	current, done := "", false
	show := func(p string) { // mu held
		if done || p == st.Progress {
			return
		}
		st.Progress = p
		save()
		if o.notify != nil {
			o.notify(name + ": " + p)
		}
	}
	ctx = context.WithValue(ctx, detailKey{}, func(d string) {
		mu.Lock()
		defer mu.Unlock()
		p := current
		if d != "" {
			p += ": " + d
		}
		show(p)
	})
	rep, err := task.Run(ctx, tasks, task.Options{
		TaskTimeout: o.TaskTimeout,
		Log:         o.Log,
		Now:         o.now,
		Notify: func(s string) {
			mu.Lock()
			defer mu.Unlock()
			current = s
			show(s)
		},
	})
	mu.Lock()
	done = true
	mu.Unlock()
	st.Finished = o.now().UTC()
	st.DurationMS = st.Finished.Sub(st.Started).Milliseconds()
	st.Progress = ""
	if rep != nil {
		st.Tasks = rep.Tasks
	}
	st.State = StateOK
	if err != nil {
		st.State, st.Error = stateFailed, err.Error()
	} else if result != nil {
		st.Result = result()
	}
	if werr := writeStage(o.Root, st); werr != nil {
		err = errors.Join(err, werr)
		if st.State == StateOK {
			st.State, st.Error = stateFailed, werr.Error()
		}
	}
	return st, err
}

type detailKey struct{}

// reportDetail adds what a running task of a stage waits for to the stage's progress (so
// `kiln-init status` shows "task 1/9: api-ready: etcd: 1 of 3 members reachable …");
// outside RunStage it does nothing.
func reportDetail(ctx context.Context, detail string) {
	if f, ok := ctx.Value(detailKey{}).(func(string)); ok {
		f(detail)
	}
}

// ConvergeWithTimeout is task.Converge with its own per-attempt deadline d, for a step
// that waits (for the API server, a node, a pod CIDR) longer than the runner's default.
func ConvergeWithTimeout(name string, deps []string, d time.Duration, step func(context.Context) (bool, error)) task.Task {
	return task.WithTimeout(task.Converge(name, deps, step), d)
}
