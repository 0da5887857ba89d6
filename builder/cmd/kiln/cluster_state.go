package main

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"

	"github.com/spf13/cobra"

	"github.com/kilnproject/kiln/builder/qemucluster"
)

// clusterRef is how the cluster verbs after up find a cluster: --name (its default state
// directory) or --state-dir.
type clusterRef struct{ name, stateDir string }

func (r *clusterRef) flags(cmd *cobra.Command) {
	cmd.Flags().StringVar(&r.name, "name", "", "cluster name (its state is in "+qemucluster.DefaultStateDir("NAME")+")")
	cmd.Flags().StringVar(&r.stateDir, "state-dir", "", "the cluster's state directory (instead of --name)")
}

func (r *clusterRef) dir() (string, error) {
	switch {
	case r.stateDir != "":
		return r.stateDir, nil
	case r.name != "":
		return qemucluster.DefaultStateDir(r.name), nil
	}
	return "", errors.New("--name or --state-dir is required")
}

func (r *clusterRef) load() (*qemucluster.State, error) {
	dir, err := r.dir()
	if err != nil {
		return nil, err
	}
	return qemucluster.Load(dir)
}

// progressPrinter shows node phases: on a terminal one line per node rewritten in place,
// otherwise a plain line per change.
type progressPrinter struct {
	mu    sync.Mutex
	w     io.Writer
	tty   bool
	order []string
	phase map[string]string
	drawn int
}

func newProgressPrinter(w io.Writer, nodes []string) *progressPrinter {
	return &progressPrinter{w: w, tty: isTerminal(w), order: nodes, phase: map[string]string{}}
}

func (p *progressPrinter) report(node, phase string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.phase[node] == phase && phase != "started" && phase != "running" {
		return // a later wait found the node where an earlier one left it
	}
	p.phase[node] = phase
	if !p.tty {
		fmt.Fprintf(p.w, "%s: %s\n", node, phase)
		return
	}
	if p.drawn > 0 {
		fmt.Fprintf(p.w, "\x1b[%dA", p.drawn)
	}
	for _, n := range p.order {
		fmt.Fprintf(p.w, "\x1b[2K  %-24s %s\n", n, strings.TrimSpace(orDefault(p.phase[n], "waiting")))
	}
	p.drawn = len(p.order)
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
