package netboot

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"
)

const (
	// stallChunk is how much of a response goes out under one write deadline: a client
	// must accept this much within the stall timeout to keep its connection.
	stallChunk = 256 << 10
	// maxRanges is the most ranges one Range header may ask for; more are refused (416).
	maxRanges = 16
	// idleTimeout closes a kept-alive connection that sends no request for this long. A
	// machine that went on to boot its kernel leaves iPXE's connection open with nobody
	// behind it, holding one of MaxConns until then.
	idleTimeout = 30 * time.Second
	// readHeaderTimeout is how long a client has to send a request's header.
	readHeaderTimeout = 10 * time.Second
)

// limits cuts responses whose client stopped reading (stallWriter), refuses Range headers
// of more than maxRanges ranges, and refuses a request with a body: no handler reads one,
// and net/http would otherwise read it, with no deadline, before answering.
func (s *Server) limits(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw := &stallWriter{ResponseWriter: w, rc: http.NewResponseController(w), timeout: s.stall}
		// Every answer goes out under a deadline, even one of headers only.
		sw.extend()
		if r.ContentLength != 0 {
			// A body, or one of unknown length (chunked), is never read: reads from now on
			// fail, and the connection is closed after the answer rather than read on to
			// the next request.
			sw.rc.SetReadDeadline(time.Now())
			w.Header().Set("Connection", "close")
			http.Error(sw, "kiln serve takes no request body", http.StatusBadRequest)
			return
		}
		if n := strings.Count(r.Header.Get("Range"), ",") + 1; n > maxRanges {
			http.Error(sw, fmt.Sprintf("%d ranges in one Range header; kiln serve answers at most %d", n, maxRanges),
				http.StatusRequestedRangeNotSatisfiable)
			return
		}
		next.ServeHTTP(sw, r)
		if sw.cut {
			s.log.Warn("client stopped reading: connection cut", "path", r.URL.Path, "remote", r.RemoteAddr,
				"bytes", sw.written, "stall_timeout", s.stall.String())
		}
	})
}

// stallWriter gives a response a write deadline that moves with it: before each chunk of
// at most stallChunk bytes it is set to timeout from now. A download that keeps moving runs
// as long as it takes; one whose client stops reading is cut after timeout.
type stallWriter struct {
	http.ResponseWriter
	rc      *http.ResponseController
	timeout time.Duration
	written int64
	// cut: a write ran out of time.
	cut bool
}

func (w *stallWriter) extend() { w.rc.SetWriteDeadline(time.Now().Add(w.timeout)) }

func (w *stallWriter) note(n int, err error) {
	w.written += int64(n)
	w.cut = w.cut || errors.Is(err, os.ErrDeadlineExceeded)
}

func (w *stallWriter) Write(p []byte) (int, error) {
	total := 0
	for len(p) > 0 {
		w.extend()
		n, err := w.ResponseWriter.Write(p[:min(len(p), stallChunk)])
		w.note(n, err)
		total += n
		p = p[n:]
		if err != nil {
			return total, err
		}
	}
	return total, nil
}

// ReadFrom sends src in chunks of stallChunk. A file in an io.LimitedReader (what
// http.ServeContent hands over) stays a file in one, so the chunks still go out with
// sendfile.
func (w *stallWriter) ReadFrom(src io.Reader) (int64, error) {
	rf, ok := w.ResponseWriter.(io.ReaderFrom)
	if !ok {
		return io.Copy(struct{ io.Writer }{w}, src)
	}
	r, left := src, int64(-1) // -1: up to EOF
	lr, limited := src.(*io.LimitedReader)
	if limited {
		r, left = lr.R, max(lr.N, 0)
	}
	var total int64
	var err error
	for left != 0 {
		w.extend()
		chunk := int64(stallChunk)
		if left > 0 {
			chunk = min(chunk, left)
		}
		var n int64
		n, err = rf.ReadFrom(&io.LimitedReader{R: r, N: chunk})
		w.note(int(n), err)
		total += n
		if left > 0 {
			left -= n
		}
		if err != nil || n < chunk {
			break
		}
	}
	if limited {
		lr.N = left
	}
	return total, err
}

// Unwrap lets http.ResponseController reach the connection.
func (w *stallWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// connLimit is a listener that holds at most cap(slots) connections open at once. Accept
// waits for one to close (the kernel's backlog holds the waiting clients), and says so in
// the log, at most once a minute.
type connLimit struct {
	net.Listener
	slots     chan struct{}
	done      chan struct{}
	closeOnce sync.Once
	log       *slog.Logger
	warned    time.Time // only Accept's goroutine uses it
}

func limitConns(ln net.Listener, n int, log *slog.Logger) *connLimit {
	return &connLimit{Listener: ln, slots: make(chan struct{}, n), done: make(chan struct{}), log: log}
}

func (l *connLimit) Accept() (net.Conn, error) {
	select {
	case l.slots <- struct{}{}:
	default:
		if time.Since(l.warned) > time.Minute {
			l.warned = time.Now()
			l.log.Warn("connection limit reached: new connections wait until one closes", "max_conns", cap(l.slots))
		}
		select {
		case l.slots <- struct{}{}:
		case <-l.done:
			return nil, net.ErrClosed
		}
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.slots
		return nil, err
	}
	return &limitedConn{Conn: c, release: func() { <-l.slots }}, nil
}

func (l *connLimit) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// limitedConn gives its slot back when closed. It passes io.ReaderFrom and CloseWrite
// through, so that files still go out with sendfile and net/http still closes gracefully.
type limitedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

func (c *limitedConn) ReadFrom(r io.Reader) (int64, error) {
	if rf, ok := c.Conn.(io.ReaderFrom); ok {
		return rf.ReadFrom(r)
	}
	return io.Copy(struct{ io.Writer }{c.Conn}, r)
}

func (c *limitedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
