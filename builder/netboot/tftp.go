package netboot

import (
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
// resolved inside the directory (os.Root), so neither ../ nor a symbolic link leads out.
type TFTP struct {
	root *os.Root
	log  *slog.Logger
}

// NewTFTP opens dir for serving.
func NewTFTP(dir string, log *slog.Logger) (*TFTP, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("--tftp-dir: %w", err)
	}
	return &TFTP{root: root, log: log}, nil
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

	n, err := t.send(name, rf)
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
	f, err := t.root.Open(rel)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return 0, fmt.Errorf("%q: no such file", name)
		}
		return 0, fmt.Errorf("%q: %w", name, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return 0, err
	}
	if !fi.Mode().IsRegular() {
		return 0, fmt.Errorf("%q: not a regular file", name)
	}
	if ot, ok := rf.(tftp.OutgoingTransfer); ok {
		ot.SetSize(fi.Size())
	}
	return rf.ReadFrom(f)
}
