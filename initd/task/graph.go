package task

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Order validates the graph and returns the tasks in the order Run tries them: a
// dependency always comes before the tasks that need it, and among tasks that are ready
// at the same time the one with the smallest name comes first, so the order depends only
// on the graph. It reports every empty or duplicate name, unknown dependency and
// dependency cycle, naming the tasks involved.
func Order(tasks []Task) ([]Task, error) {
	byName := make(map[string]Task, len(tasks))
	var errs []error
	for i, t := range tasks {
		switch {
		case t == nil:
			errs = append(errs, fmt.Errorf("task #%d is nil", i))
		case t.Name() == "":
			errs = append(errs, fmt.Errorf("task #%d has an empty name", i))
		case byName[t.Name()] != nil:
			errs = append(errs, fmt.Errorf("duplicate task name %q", t.Name()))
		default:
			byName[t.Name()] = t
		}
	}
	names := make([]string, 0, len(byName))
	for n := range byName {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		for _, d := range byName[n].Deps() {
			if byName[d] == nil {
				errs = append(errs, fmt.Errorf("task %s: unknown dependency %q", n, d))
			}
		}
	}

	// Kahn's algorithm, always taking the smallest ready name. Unknown dependencies are
	// reported above and ignored here, so that cycles are reported too.
	indeg := make(map[string]int, len(byName))
	users := make(map[string][]string, len(byName))
	for _, n := range names {
		for _, d := range uniq(byName[n].Deps()) {
			if byName[d] != nil {
				indeg[n]++
				users[d] = append(users[d], n)
			}
		}
	}
	var ready []string
	for _, n := range names {
		if indeg[n] == 0 {
			ready = append(ready, n)
		}
	}
	order := make([]Task, 0, len(byName))
	for len(ready) > 0 {
		slices.Sort(ready)
		n := ready[0]
		ready = ready[1:]
		order = append(order, byName[n])
		for _, u := range users[n] {
			if indeg[u]--; indeg[u] == 0 {
				ready = append(ready, u)
			}
		}
	}
	if len(order) < len(byName) {
		left := map[string]bool{}
		for _, n := range names {
			if indeg[n] > 0 {
				left[n] = true
			}
		}
		errs = append(errs, cycles(byName, left)...)
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("invalid task graph: %w", errors.Join(errs...))
	}
	return order, nil
}

// cycles names one cycle per strongly tangled group among the tasks left over by the
// topological sort, e.g. "dependency cycle: a -> b -> a".
func cycles(byName map[string]Task, left map[string]bool) []error {
	const (
		unseen = iota
		onPath
		finished
	)
	state := map[string]int{}
	var errs []error
	var path []string
	var visit func(n string)
	visit = func(n string) {
		state[n] = onPath
		path = append(path, n)
		deps := uniq(byName[n].Deps())
		slices.Sort(deps)
		for _, d := range deps {
			if !left[d] {
				continue
			}
			switch state[d] {
			case unseen:
				visit(d)
			case onPath:
				i := slices.Index(path, d)
				loop := append(slices.Clone(path[i:]), d)
				errs = append(errs, fmt.Errorf("dependency cycle: %s", strings.Join(loop, " -> ")))
			}
		}
		path = path[:len(path)-1]
		state[n] = finished
	}
	names := make([]string, 0, len(left))
	for n := range left {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		if state[n] == unseen {
			visit(n)
		}
	}
	return errs
}

func uniq(s []string) []string {
	out := make([]string, 0, len(s))
	for _, v := range s {
		if !slices.Contains(out, v) {
			out = append(out, v)
		}
	}
	return out
}
