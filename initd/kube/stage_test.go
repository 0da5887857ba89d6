package kube

import (
	"context"
	"strings"
	"testing"

	"github.com/kilnproject/kiln/initd/task"
)

// A task that waits says what for: kiln-init status shows it after the task's name while
// it runs, and the finished stage does not keep it.
func TestStageProgressShowsWhatATaskWaitsFor(t *testing.T) {
	root := t.TempDir()
	const quorum = "etcd: 1 of 3 members reachable (etcd-b, etcd-c unreachable)"
	var seen []string
	tasks := []task.Task{
		task.Converge("nodes", nil, func(context.Context) (bool, error) { return true, nil }),
		task.Converge("api-ready", []string{"nodes"}, func(ctx context.Context) (bool, error) {
			for _, d := range []string{quorum, quorum, "etcd: 3 of 3 members reachable"} {
				reportDetail(ctx, d)
				st, err := ReadStage(root, StageControlPlane)
				if err != nil {
					t.Fatal(err)
				}
				seen = append(seen, st.Progress)
			}
			return true, nil
		}),
	}
	st, err := RunStage(context.Background(), StageControlPlane, tasks, RunOptions{Root: root}, nil)
	if err != nil {
		t.Fatalf("RunStage: %v", err)
	}
	want := []string{"task 2/2: api-ready: " + quorum, "task 2/2: api-ready: " + quorum, "task 2/2: api-ready: etcd: 3 of 3 members reachable"}
	if strings.Join(seen, "\n") != strings.Join(want, "\n") {
		t.Errorf("progress while waiting:\n%s\nwant:\n%s", strings.Join(seen, "\n"), strings.Join(want, "\n"))
	}
	if st.State != StateOK || st.Progress != "" {
		t.Errorf("finished stage: state %s, progress %q; want ok and no progress", st.State, st.Progress)
	}
	var b strings.Builder
	if err := PrintStages(&b, []*Stage{{Name: StageControlPlane, State: stateRunning, Progress: want[0]}}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), quorum) {
		t.Errorf("kiln-init status of a waiting control plane does not say what it waits for:\n%s", b.String())
	}
	reportDetail(context.Background(), "outside a stage") // does nothing, does not panic
}
