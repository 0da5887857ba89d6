package task

import (
	"context"
	"strings"
	"testing"
)

// node is a task that is always done; only its place in the graph matters.
func node(name string, deps ...string) Task {
	return Func(name, deps, func(context.Context) (bool, error) { return true, nil }, nil)
}

func names(ts []Task) string {
	var s []string
	for _, t := range ts {
		s = append(s, t.Name())
	}
	return strings.Join(s, " ")
}

func TestOrder(t *testing.T) {
	tests := []struct {
		name  string
		tasks []Task
		want  string
	}{
		{"empty", nil, ""},
		{"independent tasks by name", []Task{node("c"), node("a"), node("b")}, "a b c"},
		{"dependency before name", []Task{node("a", "z"), node("z")}, "z a"},
		{
			"first boot shape",
			[]Task{
				node("units", "files"), node("files", "config"), node("facts"),
				node("config"), node("kubelet", "units", "preflight"), node("preflight", "facts"),
			},
			"config facts files preflight units kubelet",
		},
		{"diamond", []Task{node("d", "b", "c"), node("c", "a"), node("b", "a"), node("a")}, "a b c d"},
		{"repeated dependency", []Task{node("b", "a", "a"), node("a")}, "a b"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Order(tc.tasks)
			if err != nil {
				t.Fatal(err)
			}
			if names(got) != tc.want {
				t.Errorf("order = %q, want %q", names(got), tc.want)
			}
		})
	}
}

func TestInvalidGraph(t *testing.T) {
	tests := []struct {
		name  string
		tasks []Task
		want  []string // each must appear in the error
	}{
		{"unknown dependency", []Task{node("a"), node("b", "a", "network")}, []string{`task b: unknown dependency "network"`}},
		{"duplicate", []Task{node("files"), node("units"), node("files")}, []string{`duplicate task name "files"`}},
		{"empty name", []Task{node("")}, []string{"task #0 has an empty name"}},
		{"nil task", []Task{node("a"), nil}, []string{"task #1 is nil"}},
		{"self dependency", []Task{node("a", "a")}, []string{"dependency cycle: a -> a"}},
		{
			"cycle with tasks behind it",
			[]Task{node("a", "c"), node("b", "a"), node("c", "b"), node("d", "c"), node("e")},
			[]string{"dependency cycle: a -> c -> b -> a"},
		},
		{
			"two cycles",
			[]Task{node("a", "b"), node("b", "a"), node("x", "y"), node("y", "x")},
			[]string{"dependency cycle: a -> b -> a", "dependency cycle: x -> y -> x"},
		},
		{
			"all problems at once",
			[]Task{node("a", "b"), node("b", "a"), node("c", "nope"), node("c")},
			[]string{`duplicate task name "c"`, `task c: unknown dependency "nope"`, "dependency cycle: a -> b -> a"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ran := false
			tasks := append(tc.tasks, Func("probe", nil, func(context.Context) (bool, error) { ran = true; return true, nil }, nil))
			rep, err := Run(context.Background(), tasks, Options{})
			if err == nil {
				t.Fatal("Run accepted an invalid graph")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q\nlacks %q", err, w)
				}
			}
			if rep != nil || ran {
				t.Errorf("invalid graph: report %v, a task ran: %v; want nothing run", rep, ran)
			}
		})
	}
}
