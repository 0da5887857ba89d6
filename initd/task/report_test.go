package task

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// clock returns a Now that starts at t0 and advances by step on every call.
func clock(step time.Duration) func() time.Time {
	now := t0.Add(-step)
	return func() time.Time { now = now.Add(step); return now }
}

func sampleRun(t *testing.T) *Report {
	t.Helper()
	w := newWorld("config")
	tasks := []Task{
		w.plain("config"), w.plain("files", "config"),
		Func("etcd-volume", nil, w.check("etcd-volume"), func(context.Context) error {
			return errors.Join(errors.New("no volume tagged k8s.io/etcd/main"), errors.New("\tattach vol-1: in use"))
		}),
		w.plain("etcd-manifest", "etcd-volume"),
	}
	rep, err := Run(context.Background(), tasks, Options{Now: clock(time.Second)})
	if err == nil {
		t.Fatal("want an error")
	}
	return rep
}

func TestReportJSON(t *testing.T) {
	rep := sampleRun(t)
	data, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"started", "finished", "duration_ms", "rounds", "changed", "failed", "tasks"} {
		if _, ok := doc[k]; !ok {
			t.Errorf("report JSON lacks %q:\n%s", k, data)
		}
	}
	// A blocked task never started: no zero times in the document.
	blocked := doc["tasks"].([]any)[2].(map[string]any)
	if blocked["name"] != "etcd-manifest" || blocked["state"] != "blocked" {
		t.Fatalf("third task %v, want the blocked etcd-manifest", blocked)
	}
	if _, ok := blocked["started"]; ok {
		t.Errorf("blocked task has a start time: %v", blocked)
	}

	var back Report
	if err := json.Unmarshal(data, &back); err != nil {
		t.Fatal(err)
	}
	if back.Summary() != rep.Summary() || back.Err().Error() != rep.Err().Error() {
		t.Errorf("read back: %q / %v, want %q / %v", back.Summary(), back.Err(), rep.Summary(), rep.Err())
	}
	v := status(t, &back, "etcd-volume")
	// Two attempts of one clock tick each; the run started at t0, config took ticks 1-2.
	if v.Attempts != 2 || v.duration() != 2*time.Second || !v.Started.Equal(t0.Add(3*time.Second)) {
		t.Errorf("etcd-volume read back as %+v", v)
	}
}

func TestWriteTable(t *testing.T) {
	rep := sampleRun(t)
	var b bytes.Buffer
	if err := WriteTable(&b, rep.Tasks); err != nil {
		t.Fatal(err)
	}
	want := `TASK           STATE      ATTEMPTS  DURATION  ERROR
config         unchanged  1         1s        -
etcd-volume    failed     2         2s        apply: no volume tagged k8s.io/etcd/main; attach vol-1: in use
etcd-manifest  blocked    0         0s        blocked by failed etcd-volume
files          applied    1         1s        -
`
	if b.String() != want {
		t.Errorf("table:\n%s\nwant:\n%s", b.String(), want)
	}
	if got := rep.Summary(); got != "tasks=4 applied=1 unchanged=1 failed=1 blocked=1" {
		t.Errorf("summary %q", got)
	}
	if got := rep.Err().Error(); !strings.HasPrefix(got, "task etcd-volume failed: apply: no volume") ||
		!strings.Contains(got, "\ntask etcd-manifest blocked: blocked by failed etcd-volume") {
		t.Errorf("Err() = %q", got)
	}
}
