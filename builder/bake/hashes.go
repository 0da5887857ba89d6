package bake

import (
	"sync"

	"github.com/kilnproject/kiln/builder/output"
)

// hashes computes the outputs' SHA-256 in the background: each file is hashed from when it
// is written, while the bake writes the next one (the raw disk's hash, the longest, runs
// beside the PXE files and the conversions).
type hashes struct {
	mu   sync.Mutex
	jobs map[string]*hashJob
}

// hashJob is one file's hash under way; done closes when sum, size and err are set.
type hashJob struct {
	done chan struct{}
	sum  string
	size int64
	err  error
}

func newHashes() *hashes { return &hashes{jobs: map[string]*hashJob{}} }

// start begins hashing p (once); p must not change afterwards.
func (h *hashes) start(p string) *hashJob {
	h.mu.Lock()
	defer h.mu.Unlock()
	if j, ok := h.jobs[p]; ok {
		return j
	}
	j := &hashJob{done: make(chan struct{})}
	h.jobs[p] = j
	go func() {
		defer close(j.done)
		j.sum, j.size, j.err = output.HashFile(p)
	}()
	return j
}

// get returns p's hash and size, hashing it now if it was not started.
func (h *hashes) get(p string) (string, int64, error) {
	j := h.start(p)
	<-j.done
	return j.sum, j.size, j.err
}

// wait waits for every hash started (before the work directory they read is removed).
func (h *hashes) wait() {
	h.mu.Lock()
	jobs := make([]*hashJob, 0, len(h.jobs))
	for _, j := range h.jobs {
		jobs = append(jobs, j)
	}
	h.mu.Unlock()
	for _, j := range jobs {
		<-j.done
	}
}
