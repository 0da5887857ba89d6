package liveroot

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"time"
)

// watched ends the request (through cancel) when its body sends nothing for stall.
type watched struct {
	r      io.Reader
	stall  time.Duration
	cancel context.CancelCauseFunc
	timer  *time.Timer
}

func (w *watched) start() {
	w.timer = time.AfterFunc(w.stall, func() {
		w.cancel(fmt.Errorf("the server sent nothing for %s", w.stall))
	})
}

func (w *watched) stop() { w.timer.Stop() }

func (w *watched) Read(p []byte) (int, error) {
	n, err := w.r.Read(p)
	if n > 0 {
		w.timer.Reset(w.stall)
	}
	return n, err
}

// progress counts the bytes written through it and tells the console every so often.
type progress struct {
	log   *slog.Logger
	total int64 // -1 when the server did not say
	done  int64
	every time.Duration
	last  time.Time
}

func (p *progress) Write(b []byte) (int, error) {
	p.done += int64(len(b))
	if time.Since(p.last) >= p.every {
		p.last = time.Now()
		if p.total > 0 {
			p.log.Info(fmt.Sprintf("fetching the live root: %s of %s (%d%%)", size(p.done), size(p.total), p.done*100/p.total))
		} else {
			p.log.Info("fetching the live root: " + size(p.done))
		}
	}
	return len(b), nil
}
