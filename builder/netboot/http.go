package netboot

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"regexp"
	"strings"
	"time"
)

// Handler serves:
//
//	GET /boot.ipxe                       the chain script (no selectors in the query)
//	GET /boot.ipxe?mac=&uuid=&hostname=  the machine's script; 404 for an unknown machine
//	GET /config/<id>                     the machine's Ignition config (application/json)
//	GET /images/<name>                   a file checked at startup (Range, strong ETag)
//	GET /healthz                         "ok"
//
// and logs one line per request. A response whose client stops reading is cut after the
// stall timeout; a Range header of more than 16 ranges is refused.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /boot.ipxe", s.bootScript)
	mux.HandleFunc("GET /config/{id}", s.configFile)
	mux.HandleFunc("GET /images/{name...}", s.imageFile)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		io.WriteString(w, "ok\n")
	})
	return s.accessLog(s.limits(mux))
}

// ident is what a machine says about itself in /boot.ipxe's query, normalised; "" when
// not given (or, for uuid, firmware's placeholder).
type ident struct{ mac, uuid, hostname string }

func (id ident) empty() bool { return id == ident{} }

// parseIdent reads mac, uuid and hostname. A malformed MAC or UUID is an error; a
// hostname that is no host name is ignored (DHCP servers hand out odd ones).
func parseIdent(r *http.Request) (ident, error) {
	q := r.URL.Query()
	var id ident
	var err error
	if v := q.Get("mac"); v != "" {
		if id.mac, err = normaliseMAC(v); err != nil {
			return id, fmt.Errorf("mac: %w", err)
		}
	}
	if v := q.Get("uuid"); v != "" {
		if id.uuid, err = normaliseUUID(v); err != nil && !uuidRE.MatchString(strings.ToLower(v)) {
			return id, fmt.Errorf("uuid: %w", err)
		}
	}
	if h := strings.ToLower(q.Get("hostname")); isDNSName(h) {
		id.hostname = h
	}
	return id, nil
}

// lookup finds the machine by MAC, then UUID, then hostname.
func (s *Server) lookup(id ident) *entry {
	if e := s.byMAC[id.mac]; e != nil && id.mac != "" {
		return e
	}
	if e := s.byUUID[id.uuid]; e != nil && id.uuid != "" {
		return e
	}
	if e := s.byHost[id.hostname]; e != nil && id.hostname != "" {
		return e
	}
	return nil
}

func (s *Server) bootScript(w http.ResponseWriter, r *http.Request) {
	base, err := s.baseURL(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	id, err := parseIdent(r)
	switch {
	case err != nil:
		w.WriteHeader(http.StatusBadRequest)
		io.WriteString(w, unknownScript(id, err.Error()))
		return
	case id.empty():
		io.WriteString(w, chainScript(base))
		return
	}
	e := s.lookup(id)
	if e == nil {
		reason := "no group in machines.yaml selects it"
		s.log.Warn("unknown machine", "mac", id.mac, "uuid", id.uuid, "hostname", id.hostname, "remote", r.RemoteAddr, "reason", reason)
		w.WriteHeader(http.StatusNotFound)
		io.WriteString(w, unknownScript(id, reason))
		return
	}
	s.log.Info("boot", "machine", e.ID, "group", e.Group.Name, "mode", e.Group.Mode, "image", e.image.name, "mac", id.mac, "remote", r.RemoteAddr)
	io.WriteString(w, machineScript(base, e))
}

func (s *Server) configFile(w http.ResponseWriter, r *http.Request) {
	e := s.byID[r.PathValue("id")]
	if e == nil || e.config == nil {
		http.Error(w, "no config for "+r.PathValue("id"), http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("ETag", e.configETag)
	w.Header().Set("Cache-Control", "no-cache")
	http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(e.config))
}

// imageFile serves a file hashed at startup. One that may have changed on disk since then
// (another inode, size, mtime or ctime; not a regular file any more) is refused rather than
// served under its old ETag.
func (s *Server) imageFile(w http.ResponseWriter, r *http.Request) {
	f := s.files[r.PathValue("name")]
	if f == nil {
		http.NotFound(w, r)
		return
	}
	fh, fi, err := openRegular(os.Stat, os.OpenFile, f.path)
	if err != nil && !errors.Is(err, errNotRegular) {
		s.log.Error("open served file", "file", f.path, "error", err)
		http.Error(w, "cannot read "+f.name, http.StatusInternalServerError)
		return
	}
	if err != nil || identOf(fi) != f.ident {
		if fh != nil {
			fh.Close()
		}
		s.log.Error("served file changed since startup; restart kiln serve to check it again", "file", f.path)
		http.Error(w, f.name+" changed since kiln serve started", http.StatusServiceUnavailable)
		return
	}
	defer fh.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("ETag", f.etag())
	http.ServeContent(w, r, "", f.modTime, fh)
}

// hostRE is what a Host header may hold to be put into scripts: a name or address and port.
var hostRE = regexp.MustCompile(`^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+)(:[0-9]{1,5})?$`)

// baseURL is the URL scripts point at: --advertise-url, else the request's own.
func (s *Server) baseURL(r *http.Request) (string, error) {
	if s.advertise != "" {
		return s.advertise, nil
	}
	if !hostRE.MatchString(r.Host) {
		return "", fmt.Errorf("the Host header %q is not host[:port]", r.Host)
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return scheme + "://" + r.Host, nil
}

// Serve answers HTTP on ln until ctx ends, then stops accepting, lets requests in flight
// finish for up to drain and closes what is left. It holds at most MaxConns connections
// at once (more wait to be accepted); there is no bound on a whole transfer's time, only
// on a stall (StallTimeout), on sending a request's header (readHeaderTimeout) and on a
// kept-alive connection's idleness (idleTimeout).
func (s *Server) Serve(ctx context.Context, ln net.Listener, drain time.Duration) error {
	srv := &http.Server{
		Handler:           s.Handler(),
		ReadHeaderTimeout: readHeaderTimeout,
		IdleTimeout:       idleTimeout,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(limitConns(ln, s.maxConns, s.log)) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serve http: %w", err)
	case <-ctx.Done():
	}
	s.log.Info("shutting down: draining requests", "timeout", drain.String())
	sctx, cancel := context.WithTimeout(context.Background(), drain)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		srv.Close()
		s.log.Warn("requests still open after the drain timeout were cut", "timeout", drain.String())
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve http: %w", err)
	}
	return nil
}
