package task

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// State is the outcome of one task.
type State string

// Task states. Unchanged and Applied are success.
const (
	// StateUnchanged: Check said the desired state already held; nothing was changed.
	StateUnchanged State = "unchanged"
	// StateApplied: Apply ran and the re-Check confirmed the desired state.
	StateApplied State = "applied"
	// StateFailed: the last attempt failed (see Error); no attempt succeeded.
	StateFailed State = "failed"
	// StateBlocked: never run because a dependency failed (Error names it).
	StateBlocked State = "blocked"
	// StateSkipped: never run because the run was cancelled first.
	StateSkipped State = "skipped"
)

// ok reports whether s is a success state.
func (s State) ok() bool { return s == StateUnchanged || s == StateApplied }

// TaskStatus is the outcome of one task. Its JSON form is part of
// /var/lib/kiln/status.json.
type TaskStatus struct {
	Name  string `json:"name"`
	State State  `json:"state"`
	// Attempts counts the Check(+Apply) attempts; 0 for blocked and skipped tasks.
	Attempts int `json:"attempts"`
	// DurationMS is the time spent in the task's attempts, in milliseconds.
	DurationMS int64 `json:"duration_ms"`
	// Error is the last attempt's error, or why the task did not run.
	Error string `json:"error,omitempty"`
	// TimedOut says a failed task ran out of time: its last attempt's deadline, a wait of
	// its own (see TimedOut), or the run's wait for a fact it lacked.
	TimedOut bool `json:"timed_out,omitempty"`
	// Started is when the first attempt began, Finished when the last one ended.
	Started  time.Time `json:"started,omitzero"`
	Finished time.Time `json:"finished,omitzero"`
}

// duration is the time spent in the task's attempts, to the millisecond.
func (s TaskStatus) duration() time.Duration {
	return time.Duration(s.DurationMS) * time.Millisecond
}

// Report is the outcome of a Run, tasks in the order they were tried.
type Report struct {
	Started    time.Time `json:"started"`
	Finished   time.Time `json:"finished"`
	DurationMS int64     `json:"duration_ms"`
	// Rounds is how many passes over the pending tasks the run made.
	Rounds int `json:"rounds"`
	// Changed counts the applied tasks, Failed the failed ones (not blocked or skipped).
	Changed int          `json:"changed"`
	Failed  int          `json:"failed"`
	Tasks   []TaskStatus `json:"tasks"`
	// Waits are the run's waits for facts that tasks lacked (see Fact), in order.
	Waits []Wait `json:"waits,omitempty"`
}

// duration is how long the run took, to the millisecond.
func (r *Report) duration() time.Duration {
	return time.Duration(r.DurationMS) * time.Millisecond
}

// ok reports whether every task succeeded.
func (r *Report) ok() bool {
	for _, t := range r.Tasks {
		if !t.State.ok() {
			return false
		}
	}
	return true
}

// Summary is one line with the counts per state, e.g.
// "tasks=12 applied=5 unchanged=7 failed=0"; blocked and skipped are added when
// there are any. It only looks at Tasks.
func (r *Report) Summary() string {
	n := map[State]int{}
	for _, t := range r.Tasks {
		n[t.State]++
	}
	s := fmt.Sprintf("tasks=%d applied=%d unchanged=%d failed=%d",
		len(r.Tasks), n[StateApplied], n[StateUnchanged], n[StateFailed])
	if n[StateBlocked] > 0 {
		s += fmt.Sprintf(" blocked=%d", n[StateBlocked])
	}
	if n[StateSkipped] > 0 {
		s += fmt.Sprintf(" skipped=%d", n[StateSkipped])
	}
	return s
}

// Err is nil when every task succeeded; otherwise it joins one error per task that did
// not, "task NAME STATE: ERROR", failed tasks first. When every failed task timed out, the
// error is context.DeadlineExceeded too (see TimedOut). It only looks at Tasks, so it works
// on a report read back from JSON.
func (r *Report) Err() error {
	var failed, rest []error
	timedOut := true
	for _, t := range r.Tasks {
		if t.State.ok() {
			continue
		}
		e := fmt.Errorf("task %s %s: %s", t.Name, t.State, orDash(t.Error))
		if t.State == StateFailed {
			timedOut = timedOut && t.TimedOut
			failed = append(failed, e)
		} else {
			rest = append(rest, e)
		}
	}
	err := errors.Join(append(failed, rest...)...)
	if err != nil && len(failed) > 0 && timedOut {
		return TimedOut(err)
	}
	return err
}

// TimedOut marks err as a wait that ran out of time: the error reads as err does and is
// context.DeadlineExceeded too (errors.Is), whatever err wraps. A task returns it when a
// wait of its own gives up, so that the run reports the task as timed out.
func TimedOut(err error) error {
	if err == nil {
		return nil
	}
	return timeoutError{err}
}

type timeoutError struct{ error }

func (e timeoutError) Is(target error) bool { return target == context.DeadlineExceeded }
func (e timeoutError) Unwrap() error        { return e.error }

// WriteTable prints tasks for `kiln-init status` as a table with the columns TASK,
// STATE, ATTEMPTS, DURATION and ERROR (folded onto one line).
func WriteTable(w io.Writer, tasks []TaskStatus) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TASK\tSTATE\tATTEMPTS\tDURATION\tERROR")
	for _, t := range tasks {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", t.Name, t.State, t.Attempts, t.duration(), orDash(oneLine(t.Error)))
	}
	return tw.Flush()
}

// oneLine folds a multi-line error (errors.Join) into one line.
func oneLine(s string) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "\n", "; ")), " ")
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
