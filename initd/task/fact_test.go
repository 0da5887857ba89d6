package task

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
)

// dhcp is a lease that tasks learn through a "facts" task, the way first boot learns the
// node's address.
type dhcp struct {
	mu    sync.Mutex
	addr  string         // what the network has given so far
	seen  string         // what the facts task learnt when it last ran
	steps map[string]int // step runs per task
}

func (d *dhcp) answer(addr string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.addr = addr
}

func (d *dhcp) ran(name string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.steps[name]++
}

func (d *dhcp) learnt() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.seen
}

const address = "an address (DHCP)"

// facts learns the address; with needIt it fails itself while there is none.
func (d *dhcp) facts(needIt bool) Task {
	return Converge("facts", nil, func(context.Context) (bool, error) {
		d.ran("facts")
		d.mu.Lock()
		d.seen = d.addr
		d.mu.Unlock()
		if needIt && d.learnt() == "" {
			return false, Unknown(address, errors.New("a worker needs the node's address"))
		}
		return false, nil
	})
}

// user is a task after facts that cannot act without the address it learnt.
func (d *dhcp) user(name string, deps ...string) Task {
	return Converge(name, deps, func(context.Context) (bool, error) {
		d.ran(name)
		if d.learnt() == "" {
			return false, Unknown(address, errors.New(name+": the node has no IP address"))
		}
		return true, nil
	})
}

// other is a task that does not need the address.
func (d *dhcp) other(name string, deps ...string) Task {
	return Converge(name, deps, func(context.Context) (bool, error) { d.ran(name); return true, nil })
}

// factWaitLimit is how long the runs in factWaitCases wait for a fact.
const factWaitLimit = 100 * time.Millisecond

// factWaitCase is a run of tasks that lean on the address fact, and what it should end in.
type factWaitCase struct {
	name      string
	tasks     func(d *dhcp) []Task
	await     func(d *dhcp) func(ctx context.Context) error // nil: no Fact in the options
	want      map[string]want
	wantSteps map[string]int
	wantWaits []bool // Known of each wait
	wantTasks string // the first wait's tasks
	timesOut  bool   // the run gives up after FactWait
}

var factWaitCases = []factWaitCase{
	{
		name: "the lease comes while the run waits",
		tasks: func(d *dhcp) []Task {
			return []Task{d.facts(false), d.other("hostname", "facts"), d.user("render", "facts", "hostname"),
				d.other("kubelet", "render"), d.other("files")}
		},
		await: func(d *dhcp) func(context.Context) error {
			return func(context.Context) error { d.answer("10.0.2.15"); return nil }
		},
		want: map[string]want{
			"facts": {StateUnchanged, 2, ""}, "hostname": {StateApplied, 2, ""}, "render": {StateApplied, 3, ""},
			"kubelet": {StateApplied, 1, ""}, "files": {StateApplied, 1, ""},
		},
		wantSteps: map[string]int{"facts": 2, "hostname": 2, "render": 3, "kubelet": 1, "files": 1},
		wantWaits: []bool{true},
		wantTasks: "render",
	},
	{
		name: "the task that learns the fact lacks it itself",
		tasks: func(d *dhcp) []Task {
			return []Task{d.facts(true), d.user("render", "facts"), d.other("files")}
		},
		await: func(d *dhcp) func(context.Context) error {
			return func(context.Context) error { d.answer("fd00::15"); return nil }
		},
		want: map[string]want{
			"facts": {StateUnchanged, 3, ""}, "render": {StateApplied, 1, ""}, "files": {StateApplied, 1, ""},
		},
		wantSteps: map[string]int{"facts": 3, "render": 1, "files": 1},
		wantWaits: []bool{true},
		wantTasks: "facts",
	},
	{
		name: "two tasks lack the fact: one wait, both run again",
		tasks: func(d *dhcp) []Task {
			return []Task{d.facts(false), d.user("render", "facts"), d.user("pki", "facts"), d.other("kubelet", "render", "pki")}
		},
		await: func(d *dhcp) func(context.Context) error {
			return func(context.Context) error { d.answer("10.0.2.15"); return nil }
		},
		want: map[string]want{
			"facts": {StateUnchanged, 2, ""}, "render": {StateApplied, 3, ""}, "pki": {StateApplied, 3, ""},
			"kubelet": {StateApplied, 1, ""},
		},
		wantSteps: map[string]int{"facts": 2, "render": 3, "pki": 3, "kubelet": 1},
		wantWaits: []bool{true},
		wantTasks: "pki, render",
	},
	{
		name: "the lease never comes: fails after the limit, naming the fact",
		tasks: func(d *dhcp) []Task {
			return []Task{d.facts(false), d.user("render", "facts"), d.other("kubelet", "render")}
		},
		await: func(*dhcp) func(context.Context) error {
			return func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }
		},
		want: map[string]want{
			"facts": {StateUnchanged, 1, ""},
			"render": {StateFailed, 2, "apply: render: the node has no IP address (not known yet: an address (DHCP)); " +
				"gave up waiting for it after 100ms"},
			"kubelet": {StateBlocked, 0, "blocked by failed render"},
		},
		wantSteps: map[string]int{"facts": 1, "render": 2},
		wantWaits: []bool{false},
		wantTasks: "render",
		timesOut:  true,
	},
	{
		name: "the fact is said to be known but the task still lacks it: bounded, no spinning",
		tasks: func(d *dhcp) []Task {
			return []Task{d.facts(false), d.user("render", "facts")}
		},
		await: func(*dhcp) func(context.Context) error {
			return func(context.Context) error { return nil }
		},
		want: map[string]want{
			"facts":  {StateUnchanged, 2, ""},
			"render": {StateFailed, 4, "(not known yet: an address (DHCP)); gave up waiting for it after 100ms"},
		},
		wantSteps: map[string]int{"facts": 2, "render": 4},
		wantWaits: []bool{true, false},
		wantTasks: "render",
		timesOut:  true,
	},
	{
		name: "waiting fails",
		tasks: func(d *dhcp) []Task {
			return []Task{d.facts(false), d.user("render", "facts")}
		},
		await: func(*dhcp) func(context.Context) error {
			return func(context.Context) error { return errors.New("networkd is not running") }
		},
		want: map[string]want{
			"facts":  {StateUnchanged, 1, ""},
			"render": {StateFailed, 2, "(not known yet: an address (DHCP)); waiting for it: networkd is not running"},
		},
		wantSteps: map[string]int{"facts": 1, "render": 2},
		wantWaits: []bool{false},
		wantTasks: "render",
	},
	{
		name: "a fact the run cannot wait for is an ordinary failure",
		tasks: func(d *dhcp) []Task {
			return []Task{d.facts(false), d.user("render", "facts")}
		},
		want: map[string]want{
			"facts":  {StateUnchanged, 1, ""},
			"render": {StateFailed, 2, "apply: render: the node has no IP address (not known yet: an address (DHCP))"},
		},
		wantSteps: map[string]int{"facts": 1, "render": 2},
	},
}

// A task that fails for want of a fact is run again, with the task that learns the fact and
// everything after that one, once the fact is known; the run waits for it only as long as
// Options.FactWait allows and then fails naming it.
func TestFactWait(t *testing.T) {
	for _, tc := range factWaitCases {
		t.Run(tc.name, func(t *testing.T) { checkFactWait(t, tc) })
	}
}

// checkFactWait runs one case and checks the report, the steps, the waits and how they were
// announced.
func checkFactWait(t *testing.T, tc factWaitCase) {
	d := &dhcp{steps: map[string]int{}}
	o := Options{FactWait: factWaitLimit}
	if tc.await != nil {
		o.Facts = []Fact{{Name: address, Task: "facts", Await: tc.await(d)}}
	}
	var waiting []Wait
	o.Waiting = func(w Wait, tasks []TaskStatus) {
		waiting = append(waiting, w)
		if len(tasks) != len(tc.want) {
			t.Errorf("Waiting got %d task states, want %d", len(tasks), len(tc.want))
		}
	}
	var notes []string
	o.Notify = func(s string) { notes = append(notes, s) }
	start := time.Now()
	rep, err := Run(context.Background(), tc.tasks(d), o)
	if rep == nil {
		t.Fatalf("no report: %v", err)
	}
	checkFactWaitStates(t, rep, err, tc.want)
	for name, n := range tc.wantSteps {
		if d.steps[name] != n {
			t.Errorf("%s ran %d times, want %d (all: %v)", name, d.steps[name], n, d.steps)
		}
	}
	checkFactWaits(t, rep, tc.wantWaits)
	if len(tc.wantWaits) == 0 {
		if len(waiting) > 0 {
			t.Errorf("reported waits %v, want none", waiting)
		}
		return
	}
	checkWaitAnnounced(t, waiting, notes, tc.wantTasks)
	if tc.timesOut && time.Since(start) < factWaitLimit {
		t.Errorf("gave up after %s, before the %s limit", time.Since(start), factWaitLimit)
	}
}

// checkFactWaitStates checks each task's state, attempts and error, and that Run fails
// exactly when some task is not OK.
func checkFactWaitStates(t *testing.T, rep *Report, err error, wants map[string]want) {
	t.Helper()
	ok := true
	for name, wt := range wants {
		got := status(t, rep, name)
		if got.State != wt.state || got.Attempts != wt.attempts || !errMatches(got.Error, wt.err) {
			t.Errorf("%s: state=%s attempts=%d error=%q, want state=%s attempts=%d error~%q",
				name, got.State, got.Attempts, got.Error, wt.state, wt.attempts, wt.err)
		}
		ok = ok && wt.state.ok()
	}
	if (err == nil) != ok {
		t.Errorf("Run error %v, want failure %v", err, !ok)
	}
}

// checkFactWaits checks the report's waits: each for the address with the run's limit, and
// whether the fact became known in each.
func checkFactWaits(t *testing.T, rep *Report, wantKnown []bool) {
	t.Helper()
	var known []bool
	for _, w := range rep.Waits {
		known = append(known, w.Known)
		if w.Fact != address || w.limit() != factWaitLimit {
			t.Errorf("wait %+v: want fact %q, limit %s", w, address, factWaitLimit)
		}
	}
	if !equalBools(known, wantKnown) {
		t.Errorf("waits known=%v, want %v", known, wantKnown)
	}
}

// checkWaitAnnounced checks that the first wait was reported and notified with the tasks
// that need the fact.
func checkWaitAnnounced(t *testing.T, waiting []Wait, notes []string, tasks string) {
	t.Helper()
	if len(waiting) == 0 {
		t.Fatal("the wait was never reported")
	}
	wantLine := "waiting for an address (DHCP) (needed by " + tasks + "), 0s of 100ms"
	if got := waiting[0].String(); got != wantLine {
		t.Errorf("first wait reported as %q, want %q", got, wantLine)
	}
	if !contains(notes, wantLine) {
		t.Errorf("notified %q, want it to include %q", notes, wantLine)
	}
}

// Tasks wrapped with WithTimeout are run again like any other once a fact is known, and
// still report unchanged when their step changed nothing.
func TestFactWaitWithTimeout(t *testing.T) {
	d := &dhcp{steps: map[string]int{}}
	tasks := []Task{
		WithTimeout(d.facts(false), time.Minute),
		WithTimeout(d.other("hostname", "facts"), time.Minute),
		WithTimeout(d.user("render", "facts", "hostname"), time.Minute),
	}
	await := func(context.Context) error { d.answer("10.0.2.15"); return nil }
	o := Options{FactWait: 5 * time.Second, Facts: []Fact{{Name: address, Task: "facts", Await: await}}}
	rep, err := Run(context.Background(), tasks, o)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]State{"facts": StateUnchanged, "hostname": StateApplied, "render": StateApplied}
	for name, st := range want {
		if got := status(t, rep, name).State; got != st {
			t.Errorf("%s: state %s, want %s", name, got, st)
		}
	}
	wantSteps := map[string]int{"facts": 2, "hostname": 2, "render": 3}
	for name, n := range wantSteps {
		if d.steps[name] != n {
			t.Errorf("%s ran %d times, want %d (all: %v)", name, d.steps[name], n, d.steps)
		}
	}
}

// An invalid fact is reported before anything runs.
func TestFactsInvalid(t *testing.T) {
	await := func(context.Context) error { return nil }
	d := &dhcp{steps: map[string]int{}}
	_, err := Run(context.Background(), []Task{d.facts(false)}, Options{Facts: []Fact{
		{Name: "", Task: "facts", Await: await},
		{Name: address, Task: "gather", Await: await},
		{Name: "a lease", Task: "facts"},
		{Name: "a lease", Task: "facts", Await: await},
	}})
	for _, want := range []string{"fact #0 has an empty name", `fact "an address (DHCP)": learnt by unknown task "gather"`,
		`fact "a lease" has no Await function`, `fact "a lease" given twice`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v, want it to say %q", err, want)
		}
	}
	if len(d.steps) != 0 {
		t.Errorf("tasks ran: %v", d.steps)
	}
}

func equalBools(a, b []bool) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// A fact with a Limit of its own is waited for past Options.FactWait, its waits do not use up
// FactWait, and its Detail says in the report (and in the error, once given up) why it is
// not known yet.
func TestFactOwnLimit(t *testing.T) {
	for _, tc := range []struct {
		name      string
		arrives   time.Duration // when the lease comes; 0 never
		wantState State
		wantErr   string
	}{
		{"known within its own limit, after FactWait", 300 * time.Millisecond, StateApplied, ""},
		{"never known: the error says why", 0, StateFailed, "gave up waiting for it after 600ms (the server does not answer)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := &dhcp{steps: map[string]int{}}
			if tc.arrives > 0 {
				time.AfterFunc(tc.arrives, func() { d.answer("10.0.2.15") })
			}
			await := func(ctx context.Context) error {
				for {
					d.mu.Lock()
					got := d.addr
					d.mu.Unlock()
					if got != "" {
						return nil
					}
					select {
					case <-ctx.Done():
						return ctx.Err()
					case <-time.After(10 * time.Millisecond):
					}
				}
			}
			var waits []Wait
			o := Options{FactWait: 50 * time.Millisecond,
				Facts: []Fact{{Name: address, Task: "facts", Await: await, Limit: 600 * time.Millisecond,
					Detail: func() string { return "the server does not answer" }}},
				Waiting: func(w Wait, _ []TaskStatus) { waits = append(waits, w) }}
			rep, _ := Run(context.Background(), []Task{d.facts(false), d.user("render", "facts")}, o)
			if rep == nil {
				t.Fatal("no report")
			}
			got := status(t, rep, "render")
			if got.State != tc.wantState || !strings.Contains(got.Error, tc.wantErr) {
				t.Errorf("render: state %s error %q, want %s ~%q", got.State, got.Error, tc.wantState, tc.wantErr)
			}
			if len(waits) == 0 {
				t.Fatal("the wait was never reported")
			}
			if w := waits[0]; w.limit() != 600*time.Millisecond || w.Detail != "the server does not answer" ||
				!strings.HasSuffix(w.String(), "of 600ms: the server does not answer") {
				t.Errorf("first wait %+v (%q): want the fact's own limit and its detail", w, w.String())
			}
		})
	}
}
