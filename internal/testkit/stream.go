package testkit

import (
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
)

// Streamer is a hostile server's endless answer: it writes Total bytes (eight times the
// cap under test, say) of a config-looking JSON prefix and then spaces, chunked (no
// Content-Length), and counts the requests it streamed and the bytes it wrote. It stops
// at Total only so that a client without a cap fails its test instead of exhausting the
// machine.
type Streamer struct {
	Total  int64
	served atomic.Int64
	asked  atomic.Int64
}

// Streamed returns s, for handlers that embed a Streamer.
func (s *Streamer) Streamed() *Streamer { return s }

// Stream writes the endless answer to w.
func (s *Streamer) Stream(w http.ResponseWriter) {
	s.asked.Add(1)
	chunk := []byte(strings.Repeat(" ", 1<<20))
	copy(chunk, `{"ignition":{"version":"3.4.0"}`)
	w.WriteHeader(http.StatusOK)
	for s.served.Load() < s.Total {
		n, err := w.Write(chunk)
		s.served.Add(int64(n))
		if err != nil {
			return
		}
	}
}

// CheckStopped fails t unless the client stopped at limit, the cap: it asked for the
// endless answer once (an answer over the cap is not asked for again), the server wrote
// no more of it than the cap and what socket buffers hold ahead of the client, and
// reading it allocated (grown, from HeapAllocated) about twice the cap at most.
func (s *Streamer) CheckStopped(t *testing.T, grown uint64, limit int64) {
	t.Helper()
	if asked := s.asked.Load(); asked != 1 {
		t.Errorf("the client asked for the endless answer %d times, want once", asked)
	}
	if taken, slack := s.served.Load(), BufferSlack(); taken > limit+slack {
		t.Errorf("the client took %d MiB of the answer; the cap is %d MiB and buffers hold at most %d MiB more",
			taken>>20, limit>>20, slack>>20)
	}
	// Reading up to the cap into a growing buffer allocates about twice the cap.
	if most := uint64(4 * limit); grown > most {
		t.Errorf("reading the answer allocated %d MiB, want at most %d MiB", grown>>20, most>>20)
	}
}

// BufferSlack is how much of an answer can have been written by a server and not yet
// taken by the client when the client stops: what the kernel lets one TCP connection
// buffer (the receive buffer autotunes up to tcp_rmem's maximum, the send buffer up to
// tcp_wmem's), and 1 MiB for the HTTP server's and client's own buffers and the write
// under way. Where those limits cannot be read it is 32 MiB.
func BufferSlack() int64 {
	slack := int64(1 << 20)
	for _, name := range []string{"/proc/sys/net/ipv4/tcp_rmem", "/proc/sys/net/ipv4/tcp_wmem"} {
		b, _ := os.ReadFile(name)
		fields := strings.Fields(string(b)) // min, default, max
		if len(fields) != 3 {
			return 32 << 20
		}
		n, err := strconv.ParseInt(fields[2], 10, 64)
		if err != nil {
			return 32 << 20
		}
		slack += n
	}
	return slack
}
