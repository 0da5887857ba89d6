// Package task is kiln-init's first-boot task graph: small idempotent tasks, each of which
// checks whether its desired state already holds before it acts, run in dependency order.
// A failed task is retried as long as the run makes progress; one that lacks a fact not
// known yet (the node's address, see Fact) is retried once the run, waiting bounded, has
// learnt it. Every attempt has a deadline, and the outcome is a Report that is stored in
// /var/lib/kiln/status.json and printed by `kiln-init status`. Because every task checks first, running the same graph
// again on a configured node changes nothing.
package task

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Task is one idempotent step of the first boot.
type Task interface {
	// Name identifies the task in the graph, the logs and the report; it must be unique.
	Name() string
	// Deps names the tasks that must be done before this one runs.
	Deps() []string
	// Check reports whether the task's desired state already holds, so that there is
	// nothing to do. It must not change anything.
	Check(ctx context.Context) (done bool, err error)
	// Apply makes the desired state hold. It is only called after Check said not done,
	// and Check is asked again afterwards to confirm.
	Apply(ctx context.Context) error
}

// Timeouter is implemented by a task that needs a deadline other than
// Options.TaskTimeout for each attempt.
type Timeouter interface {
	Timeout() time.Duration
}

// errNotConverged is the error of a task whose Check still reports "not done" after
// its Apply succeeded.
var errNotConverged = errors.New("apply did not converge: check still reports not done")

// errCheckOnly is returned by the Apply of a Func task built without an apply function
// (a pure check, such as a preflight condition) when its check says not done.
var errCheckOnly = errors.New("not done, and the task has nothing to apply")

// Func builds a Task from closures. check is required; apply may be nil for a task that
// only checks a condition (it then fails with errCheckOnly while the condition does not
// hold, and is retried while other tasks make progress).
func Func(name string, deps []string, check func(context.Context) (bool, error), apply func(context.Context) error) Task {
	return &funcTask{name: name, deps: deps, check: check, apply: apply}
}

type funcTask struct {
	name  string
	deps  []string
	check func(context.Context) (bool, error)
	apply func(context.Context) error
}

func (f *funcTask) Name() string   { return f.name }
func (f *funcTask) Deps() []string { return f.deps }

func (f *funcTask) Check(ctx context.Context) (bool, error) {
	if f.check == nil {
		return false, fmt.Errorf("task %s has no check function", f.name)
	}
	return f.check(ctx)
}

func (f *funcTask) Apply(ctx context.Context) error {
	if f.apply == nil {
		return errCheckOnly
	}
	return f.apply(ctx)
}

// WithTimeout returns t with its own per-attempt deadline d instead of
// Options.TaskTimeout. The result is still reset when a fact t's run depends on becomes
// known (Resetter) and still reports unchanged when t changed nothing (Changer).
func WithTimeout(t Task, d time.Duration) Task {
	return &timeoutTask{Task: t, d: d}
}

type timeoutTask struct {
	Task
	d time.Duration
}

func (t *timeoutTask) Timeout() time.Duration { return t.d }

// Reset resets the wrapped task when it remembers having run.
func (t *timeoutTask) Reset() {
	if rs, ok := t.Task.(Resetter); ok {
		rs.Reset()
	}
}

// Changed is the wrapped task's answer; a task that cannot tell counts as changed.
func (t *timeoutTask) Changed() bool {
	c, ok := t.Task.(Changer)
	return !ok || c.Changed()
}

// Resetter is implemented by tasks that remember having run (Converge). When a Fact that a
// failed task needed becomes known, the run calls Reset on the task that learns it and on
// every task after that one, so that their next attempt runs them again with the new fact.
type Resetter interface {
	Reset()
}

// Changer is implemented by tasks that know, after Apply, whether it changed anything; one
// that changed nothing is reported unchanged.
type Changer interface {
	Changed() bool
}

// Converge builds a task from one idempotent step that reports what it changed, the shape of
// kiln's appliers (files, users, units, templates): they compare before they write, so
// running the step is its own check. The task is done once the step has succeeded; it is
// reported applied only when the step changed something.
func Converge(name string, deps []string, step func(ctx context.Context) (changed bool, err error)) Task {
	return &convergeTask{name: name, deps: deps, step: step}
}

type convergeTask struct {
	name    string
	deps    []string
	step    func(context.Context) (bool, error)
	ran     bool
	changed bool
}

func (c *convergeTask) Name() string   { return c.name }
func (c *convergeTask) Deps() []string { return c.deps }
func (c *convergeTask) Changed() bool  { return c.changed }

func (c *convergeTask) Check(context.Context) (bool, error) { return c.ran, nil }

func (c *convergeTask) Reset() { c.ran, c.changed = false, false }

func (c *convergeTask) Apply(ctx context.Context) error {
	changed, err := c.step(ctx)
	if err != nil {
		return err
	}
	c.ran, c.changed = true, changed
	return nil
}
