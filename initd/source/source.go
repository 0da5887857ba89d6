// Package source finds the node's user config (the Ignition document) at first boot.
//
// Each place a config can come from (a URL on the kernel command line, QEMU fw_cfg, the
// AWS and GCE metadata services, a CIDATA or config-drive volume, a file baked into the
// image) is a Provider; ForPlatform lists them per platform. Select asks the providers in
// the caller's order, each bounded in time, undoes gzip and base64 encodings (Decode) and
// returns the first config found. Select does not judge the bytes: a source that answers
// garbage yields those bytes and config.Parse rejects them, so garbage never falls
// through to the next source.
package source

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/kilnproject/kiln/internal/bounded"
)

// Provider is one place a config may come from.
type Provider interface {
	// Name identifies the source in logs and in the first-boot status (e.g. "fw_cfg").
	Name() string
	// Probe reports whether this source is present on this machine and holds a config.
	// It must return promptly once ctx is done.
	Probe(ctx context.Context) bool
	// Fetch returns the raw config. It is called only after Probe returned true.
	Fetch(ctx context.Context) ([]byte, error)
}

// MaxConfigSize bounds how much a provider reads, so a broken or hostile source (a
// metadata server answering gigabytes, a URL streaming without end) cannot exhaust
// memory: every source stops reading there and fails with a *TooLargeError.
const MaxConfigSize = 64 << 20

// TooLargeError is a source's answer that goes over MaxConfigSize.
type TooLargeError struct {
	// What names the answer, e.g. "imds user-data" or "tftp config.ign".
	What string
	// Limit is the cap in bytes.
	Limit int64
}

func (e *TooLargeError) Error() string {
	return fmt.Sprintf("%s is larger than the %s cap on a config", e.What, sizeString(e.Limit))
}

// RetryableError tells retrying clients (the AWS SDK's) that asking again is useless.
func (e *TooLargeError) RetryableError() bool { return false }

// sizeString renders a byte count in MiB when it is whole MiB, else in bytes.
func sizeString(n int64) string {
	if n >= 1<<20 && n%(1<<20) == 0 {
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprintf("%d bytes", n)
}

// ReadLimited reads r to the end, failing with a *TooLargeError naming what once it has
// seen more than limit bytes; it never holds more than limit bytes.
func ReadLimited(r io.Reader, limit int64, what string) ([]byte, error) {
	tooLarge := &TooLargeError{What: what, Limit: limit}
	data, err := bounded.ReadAll(r, limit, tooLarge)
	if errors.Is(err, tooLarge) {
		return nil, err
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", what, err)
	}
	return data, nil
}

// LimitBody passes through the first limit bytes of a response body and then fails with a
// *TooLargeError, so that a client library that reads whole answers into memory (the AWS
// SDK, the GCE metadata client) stops at the cap.
func LimitBody(rc io.ReadCloser, limit int64, what string) io.ReadCloser {
	return struct {
		io.Reader
		io.Closer
	}{bounded.NewReader(rc, limit, &TooLargeError{What: what, Limit: limit}), rc}
}

// Select asks each provider in order and returns the first non-empty config and the name
// of its source. Each provider gets perSourceTimeout for Probe and Fetch together
// (0 means no limit beyond ctx).
//
// The config is returned decoded (see Decode); a payload that fails to decode (a corrupt
// gzip stream) is an error.
//
// A provider whose Probe says no, times out, or whose Fetch returns no bytes is skipped.
// A provider that is present but fails to deliver (Fetch error or timeout) stops the
// search with an error: falling through to another source would apply a config the user
// did not give. When no provider has a config, Select returns nil, "", nil.
func Select(ctx context.Context, providers []Provider, perSourceTimeout time.Duration) ([]byte, string, error) {
	for _, p := range providers {
		if err := ctx.Err(); err != nil {
			return nil, "", fmt.Errorf("select config source: %w", err)
		}
		data, found, err := try(ctx, p, perSourceTimeout)
		if err != nil {
			return nil, "", fmt.Errorf("config source %s: %w", p.Name(), err)
		}
		if !found || len(data) == 0 {
			continue
		}
		decoded, err := Decode(data)
		if err != nil {
			return nil, "", fmt.Errorf("config source %s: %w", p.Name(), err)
		}
		if len(decoded) > 0 {
			return decoded, p.Name(), nil
		}
	}
	return nil, "", nil
}

type result struct {
	data  []byte
	found bool
	err   error
}

// try runs Probe and Fetch in a goroutine so that a provider stuck in a read that ignores
// ctx (a hung device, say) still cannot hold up the boot beyond the timeout.
func try(ctx context.Context, p Provider, timeout time.Duration) ([]byte, bool, error) {
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	probed := make(chan bool, 1)
	done := make(chan result, 1)
	go func() {
		present := p.Probe(ctx)
		probed <- present
		if !present {
			done <- result{}
			return
		}
		data, err := p.Fetch(ctx)
		done <- result{data: data, found: true, err: err}
	}()
	select {
	case r := <-done:
		return r.data, r.found, r.err
	case <-ctx.Done():
		select {
		case present := <-probed:
			if present {
				// Present, but the fetch did not finish in time.
				return nil, true, fmt.Errorf("fetch: %w", ctx.Err())
			}
		default:
		}
		return nil, false, nil
	}
}

// readFileLimited reads at most MaxConfigSize bytes of name and fails if there is more.
func readFileLimited(name string) ([]byte, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return ReadLimited(f, MaxConfigSize, name)
}

// isRegular reports whether name exists and is a regular file (following symlinks).
func isRegular(name string) bool {
	fi, err := os.Stat(name)
	return err == nil && fi.Mode().IsRegular()
}
