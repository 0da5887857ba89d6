package task

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// world is the state the test tasks look at and change.
type world struct {
	mu      sync.Mutex
	done    map[string]bool
	applied []string // Apply calls, in order
}

func newWorld(done ...string) *world {
	w := &world{done: map[string]bool{}}
	for _, d := range done {
		w.done[d] = true
	}
	return w
}

func (w *world) is(name string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.done[name]
}

func (w *world) set(name string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.done[name] = true
	w.applied = append(w.applied, name)
}

func (w *world) check(name string) func(context.Context) (bool, error) {
	return func(context.Context) (bool, error) { return w.is(name), nil }
}

// plain converges on the first Apply.
func (w *world) plain(name string, deps ...string) Task {
	return Func(name, deps, w.check(name), func(context.Context) error { w.set(name); return nil })
}

// needs fails to apply until other is done, without declaring it as a dependency (like
// a mount that fails until a device appears).
func (w *world) needs(name, other string, deps ...string) Task {
	return Func(name, deps, w.check(name), func(context.Context) error {
		if !w.is(other) {
			return fmt.Errorf("%s is not there yet", other)
		}
		w.set(name)
		return nil
	})
}

func (w *world) failing(name string, deps ...string) Task {
	return Func(name, deps, w.check(name), func(context.Context) error { return errors.New("disk on fire") })
}

type want struct {
	state    State
	attempts int
	err      string // substring of TaskStatus.Error; "" means none
}

// runCase is a set of tasks, what is done before Run, and what Run must report.
type runCase struct {
	name        string
	done        []string // already done before the run
	tasks       func(w *world) []Task
	maxRounds   int
	want        map[string]want
	wantApplied string // Apply calls in order
	wantRounds  int
	wantSummary string
}

var runCases = []runCase{
	{
		name: "fresh node applies everything in dependency order",
		tasks: func(w *world) []Task {
			return []Task{w.plain("units", "files"), w.plain("files", "config"), w.plain("config"), w.plain("facts")}
		},
		want: map[string]want{
			"config": {StateApplied, 1, ""}, "facts": {StateApplied, 1, ""},
			"files": {StateApplied, 1, ""}, "units": {StateApplied, 1, ""},
		},
		wantApplied: "config facts files units",
		wantRounds:  1,
		wantSummary: "tasks=4 applied=4 unchanged=0 failed=0",
	},
	{
		name: "configured node changes nothing",
		done: []string{"config", "files", "units"},
		tasks: func(w *world) []Task {
			return []Task{w.plain("units", "files"), w.plain("files", "config"), w.plain("config")}
		},
		want: map[string]want{
			"config": {StateUnchanged, 1, ""}, "files": {StateUnchanged, 1, ""}, "units": {StateUnchanged, 1, ""},
		},
		wantApplied: "",
		wantRounds:  1,
		wantSummary: "tasks=3 applied=0 unchanged=3 failed=0",
	},
	{
		name: "failure retried while progress is made converges",
		tasks: func(w *world) []Task {
			// a-mount sorts first, so it is tried before the format it needs.
			return []Task{w.needs("a-mount", "z-format"), w.plain("z-format"), w.plain("kubelet", "a-mount")}
		},
		want: map[string]want{
			"a-mount": {StateApplied, 2, ""}, "z-format": {StateApplied, 1, ""}, "kubelet": {StateApplied, 1, ""},
		},
		wantApplied: "z-format a-mount kubelet",
		wantRounds:  2,
		wantSummary: "tasks=3 applied=3 unchanged=0 failed=0",
	},
	{
		name: "round limit stops retries",
		tasks: func(w *world) []Task {
			return []Task{w.needs("a-mount", "z-format"), w.plain("z-format"), w.plain("kubelet", "a-mount")}
		},
		maxRounds: 1,
		want: map[string]want{
			"a-mount":  {StateFailed, 1, "apply: z-format is not there yet"},
			"z-format": {StateApplied, 1, ""},
			"kubelet":  {StateBlocked, 0, "blocked by failed a-mount"},
		},
		wantApplied: "z-format",
		wantRounds:  1,
		wantSummary: "tasks=3 applied=1 unchanged=0 failed=1 blocked=1",
	},
	{
		name: "a task that always fails stops after a round without progress",
		tasks: func(w *world) []Task {
			return []Task{
				w.failing("etcd-volume"), w.plain("etcd-manifest", "etcd-volume"),
				w.plain("kubelet", "etcd-manifest", "files"), w.plain("files"),
			}
		},
		want: map[string]want{
			"etcd-volume":   {StateFailed, 2, "apply: disk on fire"},
			"etcd-manifest": {StateBlocked, 0, "blocked by failed etcd-volume"},
			"kubelet":       {StateBlocked, 0, "blocked by failed etcd-volume (via etcd-manifest)"},
			"files":         {StateApplied, 1, ""},
		},
		wantApplied: "files",
		wantRounds:  2,
		wantSummary: "tasks=4 applied=1 unchanged=0 failed=1 blocked=2",
	},
	{
		name: "no progress in the first round",
		tasks: func(w *world) []Task {
			return []Task{w.failing("a"), w.failing("b")}
		},
		want: map[string]want{
			"a": {StateFailed, 1, "apply: disk on fire"}, "b": {StateFailed, 1, "apply: disk on fire"},
		},
		wantRounds:  1,
		wantSummary: "tasks=2 applied=0 unchanged=0 failed=2",
	},
	{
		name: "apply that does not converge fails",
		tasks: func(w *world) []Task {
			return []Task{
				Func("sysctl", nil, w.check("sysctl"), func(context.Context) error { return nil }),
				w.plain("kubelet", "sysctl"),
			}
		},
		want: map[string]want{
			"sysctl":  {StateFailed, 1, "apply did not converge: check still reports not done"},
			"kubelet": {StateBlocked, 0, "blocked by failed sysctl"},
		},
		wantRounds:  1,
		wantSummary: "tasks=2 applied=0 unchanged=0 failed=1 blocked=1",
	},
	{
		name: "check error fails without applying",
		tasks: func(w *world) []Task {
			return []Task{Func("files", nil,
				func(context.Context) (bool, error) { return false, errors.New("read /etc/hosts: permission denied") },
				func(context.Context) error { w.set("files"); return nil })}
		},
		want: map[string]want{
			"files": {StateFailed, 1, "check: read /etc/hosts: permission denied"},
		},
		wantRounds:  1,
		wantSummary: "tasks=1 applied=0 unchanged=0 failed=1",
	},
	{
		name: "check-only task retried until its condition holds",
		tasks: func(w *world) []Task {
			return []Task{Func("a-cri-socket", nil, w.check("z-containerd"), nil), w.plain("z-containerd")}
		},
		want: map[string]want{
			"a-cri-socket": {StateUnchanged, 2, ""}, "z-containerd": {StateApplied, 1, ""},
		},
		wantApplied: "z-containerd",
		wantRounds:  2,
		wantSummary: "tasks=2 applied=1 unchanged=1 failed=0",
	},
	{
		name: "check-only task whose condition never holds",
		tasks: func(w *world) []Task {
			return []Task{Func("swap-off", nil, w.check("never"), nil)}
		},
		want:        map[string]want{"swap-off": {StateFailed, 1, "apply: not done, and the task has nothing to apply"}},
		wantRounds:  1,
		wantSummary: "tasks=1 applied=0 unchanged=0 failed=1",
	},
	{
		name: "panic is a failure, not a crash",
		tasks: func(w *world) []Task {
			return []Task{Func("users", nil, w.check("users"), func(context.Context) error { panic("nil map") }), w.plain("files")}
		},
		want: map[string]want{
			"users": {StateFailed, 2, "panic: nil map"}, "files": {StateApplied, 1, ""},
		},
		wantApplied: "files",
		wantRounds:  2,
		wantSummary: "tasks=2 applied=1 unchanged=0 failed=1",
	},
}

func TestRun(t *testing.T) {
	for _, tc := range runCases {
		t.Run(tc.name, func(t *testing.T) { checkRun(t, tc) })
	}
}

// checkRun runs tc's tasks in a fresh world and checks the report against tc.
func checkRun(t *testing.T, tc runCase) {
	w := newWorld(tc.done...)
	rep, err := Run(context.Background(), tc.tasks(w), Options{MaxRounds: tc.maxRounds})
	if rep == nil {
		t.Fatalf("no report: %v", err)
	}
	failing := false
	for name, wt := range tc.want {
		got := status(t, rep, name)
		if got.State != wt.state || got.Attempts != wt.attempts || !errMatches(got.Error, wt.err) {
			t.Errorf("%s: state=%s attempts=%d error=%q, want state=%s attempts=%d error~%q",
				name, got.State, got.Attempts, got.Error, wt.state, wt.attempts, wt.err)
		}
		if !wt.state.ok() {
			failing = true
			if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("task %s %s: ", name, wt.state)) {
				t.Errorf("Run error %v does not name %s as %s", err, name, wt.state)
			}
		}
	}
	if len(rep.Tasks) != len(tc.want) {
		t.Errorf("report has %d tasks, want %d", len(rep.Tasks), len(tc.want))
	}
	if !failing && err != nil {
		t.Errorf("Run error %v, want nil", err)
	}
	if got := strings.Join(w.applied, " "); got != tc.wantApplied {
		t.Errorf("applied %q, want %q", got, tc.wantApplied)
	}
	if rep.Rounds != tc.wantRounds {
		t.Errorf("rounds = %d, want %d", rep.Rounds, tc.wantRounds)
	}
	if got := rep.Summary(); got != tc.wantSummary {
		t.Errorf("summary %q, want %q", got, tc.wantSummary)
	}
	if rep.ok() != !failing {
		t.Errorf("OK() = %v with failing=%v", rep.ok(), failing)
	}
}

func errMatches(got, want string) bool {
	if want == "" {
		return got == ""
	}
	return strings.Contains(got, want)
}

func status(t *testing.T, rep *Report, name string) TaskStatus {
	t.Helper()
	for _, s := range rep.Tasks {
		if s.Name == name {
			return s
		}
	}
	t.Fatalf("no task %s in report %+v", name, rep.Tasks)
	return TaskStatus{}
}

// timeoutCase is a task that takes too long, or not, and how the run ends for it.
type timeoutCase struct {
	name      string
	task      func(release <-chan struct{}) Task
	opts      Options
	want      want
	wantAfter time.Duration // the run takes at least this
	wantBlock string        // Error of the dependent task
}

// The deadline and grace of timeoutCases; the cases' errors spell them out.
const (
	timeoutDeadline = 50 * time.Millisecond
	timeoutGrace    = 100 * time.Millisecond
)

var timeoutCases = []timeoutCase{
	{
		name: "task honouring its context",
		task: func(<-chan struct{}) Task {
			return Func("dhcp", nil, func(context.Context) (bool, error) { return false, nil },
				func(ctx context.Context) error { <-ctx.Done(); return fmt.Errorf("wait for lease: %w", ctx.Err()) })
		},
		opts:      Options{TaskTimeout: timeoutDeadline, Grace: time.Hour},
		want:      want{StateFailed, 2, "timed out after 50ms: apply: wait for lease: context deadline exceeded"},
		wantAfter: 2 * timeoutDeadline,
		wantBlock: "blocked by failed dhcp",
	},
	{
		name: "task ignoring its context is given up on and not retried",
		task: func(release <-chan struct{}) Task {
			return Func("dhcp", nil, func(context.Context) (bool, error) { <-release; return true, nil }, nil)
		},
		opts:      Options{TaskTimeout: timeoutDeadline, Grace: timeoutGrace},
		want:      want{StateFailed, 1, "timed out after 50ms and still running 100ms later; given up on"},
		wantAfter: timeoutDeadline + timeoutGrace,
		wantBlock: "blocked by failed dhcp",
	},
	{
		name: "task's own timeout wins",
		task: func(release <-chan struct{}) Task {
			return WithTimeout(Func("dhcp", nil, func(context.Context) (bool, error) { <-release; return true, nil }, nil), timeoutDeadline)
		},
		opts:      Options{TaskTimeout: time.Hour, Grace: timeoutGrace},
		want:      want{StateFailed, 1, "timed out after 50ms and still running 100ms later; given up on"},
		wantAfter: timeoutDeadline + timeoutGrace,
		wantBlock: "blocked by failed dhcp",
	},
	{
		name: "slow task within its deadline",
		task: func(<-chan struct{}) Task {
			var done bool
			return Func("dhcp", nil, func(context.Context) (bool, error) { return done, nil },
				func(ctx context.Context) error {
					select {
					case <-time.After(timeoutDeadline):
						done = true
						return nil
					case <-ctx.Done():
						return ctx.Err()
					}
				})
		},
		opts:      Options{TaskTimeout: time.Minute}, // far above 50ms, however slow the machine
		want:      want{StateApplied, 1, ""},
		wantAfter: timeoutDeadline,
	},
}

func TestTimeout(t *testing.T) {
	for _, tc := range timeoutCases {
		t.Run(tc.name, func(t *testing.T) {
			release := make(chan struct{})
			t.Cleanup(func() { close(release) })
			w := newWorld()
			tasks := []Task{tc.task(release), w.plain("hostname", "dhcp"), w.plain("files")}
			start := time.Now()
			rep, _ := Run(context.Background(), tasks, tc.opts)
			took := time.Since(start)
			// The upper bound tells the deadlines from a hang (an hour of grace, a task that
			// never returns), with room for a slow machine.
			if took < tc.wantAfter || took > tc.wantAfter+30*time.Second {
				t.Errorf("run took %s, want about %s", took, tc.wantAfter)
			}
			got := status(t, rep, "dhcp")
			if got.State != tc.want.state || got.Attempts != tc.want.attempts || !errMatches(got.Error, tc.want.err) {
				t.Errorf("dhcp: state=%s attempts=%d error=%q, want state=%s attempts=%d error~%q",
					got.State, got.Attempts, got.Error, tc.want.state, tc.want.attempts, tc.want.err)
			}
			if tc.wantBlock != "" {
				if h := status(t, rep, "hostname"); h.State != StateBlocked || h.Error != tc.wantBlock {
					t.Errorf("hostname: %s %q, want blocked %q", h.State, h.Error, tc.wantBlock)
				}
			}
			if f := status(t, rep, "files"); f.State != StateApplied {
				t.Errorf("independent task: %s %q, want applied", f.State, f.Error)
			}
		})
	}
}

func TestCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := newWorld()
	tasks := []Task{
		Func("a", nil, w.check("a"), func(context.Context) error { w.set("a"); cancel(); return nil }),
		w.plain("b"),
		w.plain("c", "b"),
	}
	rep, err := Run(ctx, tasks, Options{})
	if err == nil {
		t.Fatal("cancelled run reported success")
	}
	if a := status(t, rep, "a"); a.State != StateApplied {
		t.Errorf("a: %s %q, want applied", a.State, a.Error)
	}
	for _, n := range []string{"b", "c"} {
		if s := status(t, rep, n); s.State != StateSkipped || s.Error != "not run: context canceled" {
			t.Errorf("%s: %s %q, want skipped 'not run: context canceled'", n, s.State, s.Error)
		}
	}
	if got := rep.Summary(); got != "tasks=3 applied=1 unchanged=0 failed=0 skipped=2" {
		t.Errorf("summary %q", got)
	}
}

func TestNotifyCallback(t *testing.T) {
	w := newWorld("config")
	var got []string
	_, err := Run(context.Background(), []Task{w.plain("files", "config"), w.plain("config")},
		Options{Notify: func(s string) { got = append(got, s) }})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"task 1/2: config", "task 2/2: files", "tasks=2 applied=1 unchanged=1 failed=0"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("notified %q, want %q", got, want)
	}
}

// A Converge task is applied when its step changed something and unchanged when the step
// found everything in place, so a second first boot reports nothing applied.
func TestConverge(t *testing.T) {
	for _, tc := range []struct {
		changed bool
		want    State
	}{{true, StateApplied}, {false, StateUnchanged}} {
		calls := 0
		tk := Converge("step", nil, func(context.Context) (bool, error) { calls++; return tc.changed, nil })
		rep, err := Run(context.Background(), []Task{tk}, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if got := rep.Tasks[0].State; got != tc.want || calls != 1 {
			t.Errorf("changed=%v: state %s after %d calls, want %s after 1", tc.changed, got, calls, tc.want)
		}
	}
}

// A run whose failed tasks all ran out of time (their deadline, a wait of their own, the
// wait for a fact) says so: its error is context.DeadlineExceeded; any other failure
// among them makes it a plain failure.
func TestTimedOutErr(t *testing.T) {
	const d = 20 * time.Millisecond
	waitLease := func(ctx context.Context) error { <-ctx.Done(); return fmt.Errorf("wait for lease: %w", ctx.Err()) }
	fail := func(err error) func(context.Context) error { return func(context.Context) error { return err } }
	notDone := func(context.Context) (bool, error) { return false, nil }
	noAddr := func(context.Context) (bool, error) { return false, Unknown("address", errors.New("no address")) }
	tests := []struct {
		name  string
		tasks []Task
		facts []Fact
		want  bool
	}{
		{"deadline", []Task{Func("dhcp", nil, notDone, waitLease)}, nil, true},
		{"own wait", []Task{Func("cni", nil, notDone, fail(TimedOut(errors.New("no pod CIDR after 15m"))))}, nil, true},
		{"fact wait", []Task{Func("facts", nil, noAddr, nil)},
			[]Fact{{Name: "address", Task: "facts", Await: func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }}}, true},
		{"plain failure", []Task{Func("files", nil, notDone, fail(errors.New("disk full")))}, nil, false},
		{"timeout and failure", []Task{Func("dhcp", nil, notDone, waitLease),
			Func("files", nil, notDone, fail(errors.New("disk full")))}, nil, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rep, err := Run(context.Background(), tc.tasks, Options{TaskTimeout: d, Grace: time.Hour, Facts: tc.facts, FactWait: d})
			if err == nil {
				t.Fatal("want an error")
			}
			if got := errors.Is(err, context.DeadlineExceeded); got != tc.want {
				t.Errorf("errors.Is(%q, DeadlineExceeded) = %v, want %v", err, got, tc.want)
			}
			if got := errors.Is(rep.Err(), context.DeadlineExceeded); got != tc.want {
				t.Errorf("report's Err: timed out %v, want %v", got, tc.want)
			}
			if s := rep.Tasks[0]; s.TimedOut != (tc.want || tc.name == "timeout and failure") {
				t.Errorf("%s: TimedOut %v", s.Name, s.TimedOut)
			}
		})
	}
}
