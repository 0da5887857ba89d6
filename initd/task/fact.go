package task

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// A Fact is something about the machine that tasks need and that may become known only
// while the run goes on — the address a slow DHCP server hands out, say. A task that fails
// because a fact is not known yet returns an UnknownError naming it; when no task can make
// progress, the run waits (bounded by Options.FactWait) for the fact, then runs the task
// that learns it again, every task after that one in the graph, and the failed task.
type Fact struct {
	// Name says what the fact is, as people read it in the status and the logs, e.g.
	// "an IPv4/IPv6 address on a link (DHCP)". UnknownError.Fact refers to it.
	Name string
	// Task names the task that learns the fact (gathers the node's facts, say).
	Task string
	// Await blocks until the fact is known, so that running Task again learns it, and
	// returns nil; or until ctx ends, returning ctx's error.
	Await func(ctx context.Context) error
	// Limit, if set, bounds the waits for this fact on their own (all of them together),
	// instead of counting them against Options.FactWait: for a fact that other machines
	// provide, such as a peer that boots minutes later.
	Limit time.Duration
	// Detail, if set, says in a few words why the fact is not known yet (what was tried
	// last); it is asked each time the wait is reported (Wait.Detail).
	Detail func() string
}

// UnknownError is the error of a task that cannot act because a fact it needs is not
// known yet (see Fact). Build it with Unknown.
type UnknownError struct {
	// Fact is the Name of the missing Fact.
	Fact string
	// Err says what the task could not do without it; it may be nil.
	Err error
}

// Unknown returns an UnknownError: the task needs fact, which is not known yet; err (may be
// nil) says what for.
func Unknown(fact string, err error) error {
	return &UnknownError{Fact: fact, Err: err}
}

func (e *UnknownError) Error() string {
	if e.Err == nil {
		return "not known yet: " + e.Fact
	}
	return fmt.Sprintf("%v (not known yet: %s)", e.Err, e.Fact)
}

func (e *UnknownError) Unwrap() error { return e.Err }

// unknownFact returns the fact err says is missing, or "".
func unknownFact(err error) string {
	var u *UnknownError
	if errors.As(err, &u) {
		return u.Fact
	}
	return ""
}

// Wait is the run waiting for a fact that failed tasks need. Its JSON form is part of
// /var/lib/kiln/status.json.
type Wait struct {
	// Fact is the Name of the awaited Fact.
	Fact string `json:"fact"`
	// Tasks are the failed tasks that need it.
	Tasks []string `json:"tasks"`
	// Started is when this wait began.
	Started time.Time `json:"started"`
	// WaitedMS is the time the run has spent waiting for facts so far, this wait
	// included, and LimitMS the most it waits in all (Options.FactWait), in milliseconds;
	// for a fact with its own Limit, the time spent waiting for that fact and its Limit.
	WaitedMS int64 `json:"waited_ms"`
	LimitMS  int64 `json:"limit_ms"`
	// Detail is the fact's Detail when the wait was last reported.
	Detail string `json:"detail,omitempty"`
	// Known is set when the wait ended because the fact became known.
	Known bool `json:"known,omitempty"`
}

// Waited is the time the run has spent waiting for facts so far.
func (w Wait) Waited() time.Duration { return time.Duration(w.WaitedMS) * time.Millisecond }

// limit is the most the run waits for facts in all.
func (w Wait) limit() time.Duration { return time.Duration(w.LimitMS) * time.Millisecond }

// String is the wait as `kiln-init status` and systemd's STATUS= show it, e.g.
// "waiting for an IPv4/IPv6 address on a link (DHCP) (needed by facts), 12s of 1m30s".
// With a Detail: "waiting for … (needed by etcd-join), 12s of 1h0m0s: the seed member a does
// not answer".
func (w Wait) String() string {
	s := fmt.Sprintf("waiting for %s (needed by %s), %s of %s", w.Fact, strings.Join(w.Tasks, ", "),
		roundDuration(w.Waited()), roundDuration(w.limit()))
	if w.Detail != "" {
		s += ": " + w.Detail
	}
	return s
}

// roundDuration rounds d to the second, or below a second to the millisecond.
func roundDuration(d time.Duration) time.Duration {
	if d < time.Second {
		return d.Round(time.Millisecond)
	}
	return d.Round(time.Second)
}

// checkFacts reports facts without a name or an Await function, facts given twice and
// facts learnt by a task that is not in the graph.
func checkFacts(order []Task, facts []Fact) error {
	tasks := make(map[string]bool, len(order))
	for _, t := range order {
		tasks[t.Name()] = true
	}
	seen := map[string]bool{}
	var errs []error
	for i, f := range facts {
		switch {
		case f.Name == "":
			errs = append(errs, fmt.Errorf("fact #%d has an empty name", i))
		case seen[f.Name]:
			errs = append(errs, fmt.Errorf("fact %q given twice", f.Name))
		case !tasks[f.Task]:
			errs = append(errs, fmt.Errorf("fact %q: learnt by unknown task %q", f.Name, f.Task))
		case f.Await == nil:
			errs = append(errs, fmt.Errorf("fact %q has no Await function", f.Name))
		}
		seen[f.Name] = true
	}
	if len(errs) > 0 {
		return fmt.Errorf("invalid task graph: %w", errors.Join(errs...))
	}
	return nil
}

// missingFact returns the first of Options.Facts that failed tasks lack, with those
// tasks in the run's order; nil when no failed task lacks a fact the run can wait for.
func (r *runner) missingFact() (*Fact, []string) {
	for i := range r.o.Facts {
		f := &r.o.Facts[i]
		var tasks []string
		for _, t := range r.order {
			n := t.Name()
			if r.status[n].State == StateFailed && !r.abandoned[n] && unknownFact(r.lastErr[n]) == f.Name {
				tasks = append(tasks, n)
			}
		}
		if len(tasks) > 0 {
			return f, tasks
		}
	}
	return nil, nil
}

// awaitFact follows a round without progress. When failed tasks lack a fact, it waits for
// the fact within what is left of Options.FactWait (or of the fact's own Limit), reporting the wait; once the fact is
// known it resets the task that learns it and every task after that one and reports true:
// the run goes on. It reports false when no task lacks a fact, when the run is cancelled,
// and when the wait ends without the fact; then the error of each task that needed it says
// how long the run waited.
func (r *runner) awaitFact(ctx context.Context) bool {
	f, tasks := r.missingFact()
	if f == nil {
		return false
	}
	limit, waited := r.o.FactWait, r.waited
	if f.Limit > 0 {
		limit, waited = f.Limit, r.waitedFor[f.Name]
	}
	w := Wait{Fact: f.Name, Tasks: tasks, Started: r.o.Now().UTC(),
		WaitedMS: waited.Milliseconds(), LimitMS: limit.Milliseconds()}
	left := limit - waited
	if left <= 0 {
		r.gaveUp(tasks, "gave up waiting for it after "+roundDuration(limit).String(), true)
		return false
	}
	r.o.Log.Info("waiting for a fact", "fact", f.Name, "tasks", tasks, "waited", waited.Round(time.Millisecond), "limit", limit)

	start := time.Now()
	err := r.watchAwait(ctx, f, &w, waited, left, start)
	took := time.Since(start)
	if f.Limit > 0 {
		r.waitedFor[f.Name] += took
		waited = r.waitedFor[f.Name]
	} else {
		r.waited += took
		waited = r.waited
	}
	w.WaitedMS, w.Known = waited.Milliseconds(), err == nil
	r.rep.Waits = append(r.rep.Waits, w)
	switch {
	case ctx.Err() != nil:
		return false
	case errors.Is(err, context.DeadlineExceeded):
		r.o.Log.Warn("gave up waiting for a fact", "fact", f.Name, "tasks", tasks, "waited", waited.Round(time.Millisecond))
		why := "gave up waiting for it after " + roundDuration(limit).String()
		if w.Detail != "" {
			why += " (" + w.Detail + ")"
		}
		r.gaveUp(tasks, why, true)
		return false
	case err != nil:
		r.o.Log.Warn("waiting for a fact failed", "fact", f.Name, "tasks", tasks, "error", err)
		r.gaveUp(tasks, fmt.Sprintf("waiting for it: %v", err), false)
		return false
	}
	r.awaited[f.Name]++
	r.o.Log.Info("fact known; running the tasks that need it again", "fact", f.Name, "learner", f.Task,
		"waited", took.Round(time.Millisecond))
	r.rerun(f.Task)
	return true
}

// watchAwait runs f's Await bounded by left and returns its error, reporting w as the wait
// begins and every waitReport after. An Await that ignores its deadline is given up on
// Options.Grace after it.
func (r *runner) watchAwait(ctx context.Context, f *Fact, w *Wait, waited, left time.Duration, start time.Time) error {
	wctx, cancel := context.WithTimeout(ctx, left)
	defer cancel()
	ch := startAwait(wctx, f, r.awaited[f.Name] > 0)
	report := func() {
		if f.Detail != nil {
			w.Detail = f.Detail()
		}
		r.o.Notify(w.String())
		r.o.Waiting(*w, append([]TaskStatus(nil), r.rep.Tasks...))
	}
	report() // as the wait begins: WaitedMS is what earlier waits took
	tick := time.NewTicker(waitReport)
	defer tick.Stop()
	var grace <-chan time.Time
	done := wctx.Done()
	for {
		select {
		case err := <-ch:
			return err
		case <-tick.C:
			w.WaitedMS = (waited + time.Since(start)).Milliseconds()
			report()
		case <-done:
			done, grace = nil, time.After(r.o.Grace)
		case <-grace:
			return fmt.Errorf("still waiting %s after the deadline: %w", r.o.Grace, wctx.Err())
		}
	}
}

// startAwait runs f's Await in a goroutine and delivers its error. With pace (the fact was
// known before, yet a task still lacks it) it first waits waitReport, so that the run does
// not spin.
func startAwait(ctx context.Context, f *Fact, pace bool) <-chan error {
	ch := make(chan error, 1) // buffered: an Await ignoring its context must not block forever
	go func() {
		defer func() {
			if p := recover(); p != nil {
				ch <- fmt.Errorf("panic: %v", p)
			}
		}()
		if pace {
			select {
			case <-time.After(waitReport):
			case <-ctx.Done():
				ch <- ctx.Err()
				return
			}
		}
		ch <- f.Await(ctx)
	}()
	return ch
}

// gaveUp adds why the run stopped waiting to the errors of the tasks that lacked a fact;
// timedOut says the wait ran out of time.
func (r *runner) gaveUp(tasks []string, why string, timedOut bool) {
	for _, n := range tasks {
		st := r.status[n]
		st.Error += "; " + why
		st.TimedOut = st.TimedOut || timedOut
	}
}

// rerun makes learner and every task after it in the graph run again: done ones become
// pending, and those that remember having run are reset.
func (r *runner) rerun(learner string) {
	again := map[string]bool{learner: true}
	for _, t := range r.order {
		n := t.Name()
		for _, d := range t.Deps() {
			if again[d] {
				again[n] = true
			}
		}
		if !again[n] || r.abandoned[n] {
			continue
		}
		if rs, ok := t.(Resetter); ok {
			rs.Reset()
		}
		if st := r.status[n]; st.State.ok() {
			st.State = ""
		}
	}
}
