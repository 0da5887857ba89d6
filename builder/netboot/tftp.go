package netboot

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/pin/tftp/v3"
)

// TFTP serves the files under a directory read-only over TFTP, for firmware that must
// chainload iPXE first (ipxe.efi, undionly.kpxe). Write requests are refused; names are
// resolved inside the directory (os.Root), so neither ../ nor a symbolic link leads out;
// only regular files are sent (a FIFO, device or directory is refused unopened). At most
// maxTransfers transfers run at once: each holds a file and a UDP socket until its client
// has acknowledged the last block or stopped answering, and a request beyond them is
// answered with an error at once.
type TFTP struct {
	root *os.Root
	log  *slog.Logger
	// slots holds one token per transfer in flight.
	slots chan struct{}
}

// NewTFTP opens dir for serving at most maxTransfers transfers at once (0 means
// DefaultMaxConns).
func NewTFTP(dir string, maxTransfers int, log *slog.Logger) (*TFTP, error) {
	if maxTransfers < 0 {
		return nil, fmt.Errorf("%d TFTP transfers at once: cannot be negative", maxTransfers)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("--tftp-dir: %w", err)
	}
	return &TFTP{root: root, log: log, slots: make(chan struct{}, cmp.Or(maxTransfers, DefaultMaxConns))}, nil
}

// Serve answers read requests on conn until ctx ends.
func (t *TFTP) Serve(ctx context.Context, conn net.PacketConn) error {
	srv := tftp.NewServer(t.read, nil)
	srv.SetTimeout(5 * time.Second)
	done := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			srv.Shutdown()
		case <-done:
		}
	}()
	err := srv.Serve(conn)
	close(done)
	t.root.Close()
	if err != nil && ctx.Err() == nil {
		return fmt.Errorf("serve tftp: %w", err)
	}
	return nil
}

// read sends one file. The name is taken relative to the directory (a leading / is
// dropped, as PXE clients often send one).
func (t *TFTP) read(name string, rf io.ReaderFrom) error {
	start := time.Now()
	remote := ""
	if ot, ok := rf.(tftp.OutgoingTransfer); ok {
		addr := ot.RemoteAddr()
		remote = addr.String()
	}

	var n int64
	var err error
	select {
	case t.slots <- struct{}{}:
		n, err = t.send(name, rf)
		<-t.slots
	default:
		err = fmt.Errorf("%q: busy with as many transfers as it runs at once (%d); try again", name, cap(t.slots))
	}
	attrs := []any{"file", name, "bytes", n, "duration", time.Since(start), "remote", remote}
	if err != nil {
		t.log.Warn("tftp", append(attrs, "error", err)...)
		return err
	}
	t.log.Info("tftp", attrs...)
	return nil
}

func (t *TFTP) send(name string, rf io.ReaderFrom) (int64, error) {
	rel := strings.TrimLeft(filepath.ToSlash(name), "/")
	if !filepath.IsLocal(rel) {
		return 0, fmt.Errorf("%q: not a file under the TFTP directory", name)
	}
	// Anything but a regular file is refused before it is opened: a FIFO would hold the
	// request (and a thread) until someone writes to it.
	f, fi, err := openRegular(t.root.Stat, t.root.OpenFile, rel)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return 0, fmt.Errorf("%q: no such file", name)
	case errors.Is(err, errNotRegular):
		return 0, err
	case err != nil:
		return 0, fmt.Errorf("%q: %w", name, err)
	}
	defer f.Close()
	if ot, ok := rf.(tftp.OutgoingTransfer); ok {
		ot.SetSize(fi.Size())
	}
	return rf.ReadFrom(f)
}
