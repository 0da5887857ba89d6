package liveroot

import (
	"fmt"
	"log/slog"
	"time"
)

// progress counts the bytes written through it and tells the console every so often.
type progress struct {
	log   *slog.Logger
	total int64 // -1 when the server did not say
	done  int64
	every time.Duration
	last  time.Time
	// verb says what is done to the image: "" means fetching.
	verb string
}

func (p *progress) Write(b []byte) (int, error) {
	p.done += int64(len(b))
	if time.Since(p.last) >= p.every {
		p.last = time.Now()
		verb := p.verb
		if verb == "" {
			verb = "fetching"
		}
		if p.total > 0 {
			p.log.Info(fmt.Sprintf("%s the live root: %s of %s (%d%%)", verb, size(p.done), size(p.total), p.done*100/p.total))
		} else {
			p.log.Info(verb + " the live root: " + size(p.done))
		}
	}
	return len(b), nil
}
