package task

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"
)

// Options configure Run. The zero value works.
type Options struct {
	// TaskTimeout bounds each attempt of a task (Check, Apply and the re-Check together);
	// 0 means 2 minutes. A task implementing Timeouter sets its own.
	TaskTimeout time.Duration
	// Grace is how long Run waits past an attempt's deadline for a task that ignores its
	// context before it gives up on it; 0 means 5 seconds. A task given up on is failed
	// and not tried again, since it may still be running.
	Grace time.Duration
	// MaxRounds bounds the passes over the pending tasks; 0 means one more than the
	// number of tasks, which is as many as a run that keeps making progress can need.
	MaxRounds int
	// Log receives progress; nil discards it.
	Log *slog.Logger
	// Now is the clock for the report; nil means time.Now. Deadlines use the real clock.
	Now func() time.Time
	// Notify, if set, is told what the run is doing, e.g. "task 3/12: files", what it waits
	// for while it waits for a fact (Wait.String), and at the end the Summary; the caller
	// wires it to sd_notify STATUS=.
	Notify func(status string)
	// Facts are the facts tasks may fail without (see Fact and UnknownError); the run
	// waits for them instead of failing those tasks at once.
	Facts []Fact
	// FactWait bounds the time the run spends waiting for facts, all waits together; 0
	// means defaultFactWait. A task that still lacks its fact then fails, and its error
	// says how long the run waited.
	FactWait time.Duration
	// Waiting, if set, is called when the run starts waiting for a fact and about every
	// second while it waits, with the wait so far and a copy of the tasks' states (the
	// caller records them where `kiln-init status` reads them).
	Waiting func(w Wait, tasks []TaskStatus)
}

// defaultFactWait is Options.FactWait's default.
const defaultFactWait = 90 * time.Second

// waitReport is how often a waiting run reports the wait.
const waitReport = time.Second

func (o Options) withDefaults(n int) Options {
	if o.TaskTimeout <= 0 {
		o.TaskTimeout = 2 * time.Minute
	}
	if o.Grace <= 0 {
		o.Grace = 5 * time.Second
	}
	if o.MaxRounds <= 0 {
		o.MaxRounds = n + 1
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Notify == nil {
		o.Notify = func(string) {}
	}
	if o.FactWait <= 0 {
		o.FactWait = defaultFactWait
	}
	if o.Waiting == nil {
		o.Waiting = func(Wait, []TaskStatus) {}
	}
	return o
}

// Run validates the graph (see Order; an invalid graph runs nothing and returns a nil
// report) and then runs the tasks in rounds. Each round tries, in Order, every pending
// task whose dependencies are done, so a graph without failures finishes in one round. A
// task is done when Check says so (unchanged) or when Apply succeeds and a second Check
// confirms it (applied). A failed task stays pending and is tried again in the next round
// if the round made progress. After a round without progress the run waits for a fact
// that failed tasks lack (an UnknownError naming one of Options.Facts), bounded by
// Options.FactWait, and once it is known runs the task that learns it and the tasks after
// that one again; otherwise the run ends, leaving the failed tasks failed and those behind
// them blocked. MaxRounds counts the rounds since the last wait. Run returns the report
// together with Report.Err, so the caller can record the report in every case.
func Run(ctx context.Context, tasks []Task, o Options) (*Report, error) {
	order, err := Order(tasks)
	if err != nil {
		return nil, err
	}
	if err := checkFacts(order, o.Facts); err != nil {
		return nil, err
	}
	o = o.withDefaults(len(order))
	r := &runner{
		o:         o,
		order:     order,
		status:    make(map[string]*TaskStatus, len(order)),
		abandoned: map[string]bool{},
		lastErr:   map[string]error{},
		awaited:   map[string]int{},
		waitedFor: map[string]time.Duration{},
	}
	rep := &Report{Started: o.Now().UTC(), Tasks: make([]TaskStatus, len(order))}
	r.rep = rep
	for i, t := range order {
		rep.Tasks[i].Name = t.Name()
		r.status[t.Name()] = &rep.Tasks[i]
	}

	for rounds := 0; rounds < o.MaxRounds && ctx.Err() == nil && r.pending() > 0; {
		rep.Rounds++
		rounds++
		if rep.Rounds > 1 {
			o.Log.Info("retrying failed tasks", "round", rep.Rounds, "pending", r.pending())
		}
		if r.round(ctx) {
			continue
		}
		if !r.awaitFact(ctx) {
			break
		}
		rounds = 0
	}
	r.finish(ctx)

	rep.Finished = o.Now().UTC()
	rep.DurationMS = rep.Finished.Sub(rep.Started).Milliseconds()
	for _, t := range rep.Tasks {
		switch t.State {
		case StateApplied:
			rep.Changed++
		case StateFailed:
			rep.Failed++
		}
	}
	o.Notify(rep.Summary())
	if err := rep.Err(); err != nil {
		o.Log.Error("tasks failed", "summary", rep.Summary(), "rounds", rep.Rounds)
		return rep, err
	}
	o.Log.Info("tasks done", "summary", rep.Summary(), "rounds", rep.Rounds, "duration", rep.duration())
	return rep, nil
}

type runner struct {
	o         Options
	order     []Task
	rep       *Report
	status    map[string]*TaskStatus
	abandoned map[string]bool          // given up on after ignoring its deadline; never retried
	lastErr   map[string]error         // each failed task's last error
	waited    time.Duration            // spent waiting for facts without a Limit of their own
	waitedFor map[string]time.Duration // spent waiting for each fact with a Limit
	awaited   map[string]int           // waits per fact that ended with the fact known
}

func (r *runner) done(name string) bool { return r.status[name].State.ok() }

func (r *runner) pending() int {
	n := 0
	for _, t := range r.order {
		if !r.done(t.Name()) && !r.abandoned[t.Name()] {
			n++
		}
	}
	return n
}

// round tries every pending task whose dependencies are done and reports whether any
// task became done.
func (r *runner) round(ctx context.Context) (progress bool) {
	for _, t := range r.order {
		name := t.Name()
		if r.done(name) || r.abandoned[name] || !r.ready(t) {
			continue
		}
		if ctx.Err() != nil {
			return progress
		}
		r.o.Notify(fmt.Sprintf("task %d/%d: %s", r.countDone()+1, len(r.order), name))
		st := r.status[name]
		start := r.o.Now().UTC()
		if st.Attempts == 0 {
			st.Started = start
		}
		st.Attempts++
		state, err := r.attempt(ctx, t)
		st.Finished = r.o.Now().UTC()
		st.DurationMS += st.Finished.Sub(start).Milliseconds()
		if err != nil {
			st.State, st.Error = StateFailed, err.Error()
			st.TimedOut = errors.Is(err, context.DeadlineExceeded)
			r.lastErr[name] = err
			r.o.Log.Warn("task failed", "task", name, "attempt", st.Attempts, "error", err)
			continue
		}
		delete(r.lastErr, name)
		st.State, st.Error, st.TimedOut = state, "", false
		progress = true
		lvl := slog.LevelDebug
		if state == StateApplied {
			lvl = slog.LevelInfo
		}
		r.o.Log.Log(ctx, lvl, "task "+string(state), "task", name, "attempt", st.Attempts,
			"duration", st.Finished.Sub(start).Round(time.Millisecond))
	}
	return progress
}

func (r *runner) ready(t Task) bool {
	for _, d := range t.Deps() {
		if !r.done(d) {
			return false
		}
	}
	return true
}

func (r *runner) countDone() int {
	n := 0
	for _, t := range r.order {
		if r.done(t.Name()) {
			n++
		}
	}
	return n
}

// finish gives every task that never ran its state: blocked behind failed tasks, or
// skipped when the run was cancelled first.
func (r *runner) finish(ctx context.Context) {
	for _, t := range r.order {
		st := r.status[t.Name()]
		if st.State != "" {
			continue
		}
		if failed := r.failedUpstream(t, map[string]bool{}); len(failed) > 0 {
			st.State = StateBlocked
			st.Error = "blocked by failed " + strings.Join(failed, ", ")
			if via := r.unfinishedDeps(t); !slices.Equal(via, failed) {
				st.Error += " (via " + strings.Join(via, ", ") + ")"
			}
			continue
		}
		st.State = StateSkipped
		if err := ctx.Err(); err != nil {
			st.Error = "not run: " + context.Cause(ctx).Error()
		} else {
			st.Error = "not run: round limit reached"
		}
	}
}

// unfinishedDeps names t's direct dependencies that are not done, sorted.
func (r *runner) unfinishedDeps(t Task) []string {
	var out []string
	for _, d := range uniq(t.Deps()) {
		if !r.done(d) {
			out = append(out, d)
		}
	}
	slices.Sort(out)
	return out
}

// failedUpstream names the failed tasks that t waits for, directly or through
// dependencies that never ran, sorted.
func (r *runner) failedUpstream(t Task, seen map[string]bool) []string {
	var out []string
	for _, d := range r.unfinishedDeps(t) {
		if seen[d] {
			continue
		}
		seen[d] = true
		if r.status[d].State == StateFailed {
			out = append(out, d)
			continue
		}
		for _, u := range r.order {
			if u.Name() == d {
				out = append(out, r.failedUpstream(u, seen)...)
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

type result struct {
	state State
	err   error
}

// attempt runs Check (and Apply plus the confirming Check) under the task's deadline in
// its own goroutine, so that a task ignoring its context cannot hold up the run for more
// than the deadline plus the grace period.
func (r *runner) attempt(ctx context.Context, t Task) (State, error) {
	d := r.o.TaskTimeout
	if tt, ok := t.(Timeouter); ok && tt.Timeout() > 0 {
		d = tt.Timeout()
	}
	actx, cancel := context.WithTimeout(ctx, d)
	defer cancel()

	ch := make(chan result, 1) // buffered: an abandoned task's goroutine must not block forever
	go func() {
		defer func() {
			if p := recover(); p != nil {
				ch <- result{err: fmt.Errorf("panic: %v", p)}
			}
		}()
		s, err := checkApply(actx, t)
		ch <- result{s, err}
	}()

	var res result
	select {
	case res = <-ch:
	case <-actx.Done():
		grace := time.NewTimer(r.o.Grace)
		defer grace.Stop()
		select {
		case res = <-ch:
		case <-grace.C:
			r.abandoned[t.Name()] = true
			if ctx.Err() != nil {
				return "", fmt.Errorf("cancelled (%w) and still running %s later; given up on", context.Cause(ctx), r.o.Grace)
			}
			return "", fmt.Errorf("timed out after %s and still running %s later; given up on: %w", d, r.o.Grace, context.DeadlineExceeded)
		}
	}
	if res.err != nil && ctx.Err() == nil && errors.Is(actx.Err(), context.DeadlineExceeded) {
		return "", TimedOut(fmt.Errorf("timed out after %s: %w", d, res.err))
	}
	return res.state, res.err
}

func checkApply(ctx context.Context, t Task) (State, error) {
	done, err := t.Check(ctx)
	if err != nil {
		return "", fmt.Errorf("check: %w", err)
	}
	if done {
		return StateUnchanged, nil
	}
	if err := t.Apply(ctx); err != nil {
		return "", fmt.Errorf("apply: %w", err)
	}
	done, err = t.Check(ctx)
	if err != nil {
		return "", fmt.Errorf("check after apply: %w", err)
	}
	if !done {
		return "", errNotConverged
	}
	if c, ok := t.(Changer); ok && !c.Changed() {
		return StateUnchanged, nil
	}
	return StateApplied, nil
}
