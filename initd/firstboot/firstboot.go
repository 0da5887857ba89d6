// Package firstboot is `kiln-init firstboot`, the oneshot service that configures a node
// on its first boot: it takes the user config from the first source that has one, checks
// that kiln can apply all of it, applies it under the node's root and records the outcome
// in /var/lib/kiln/status.json. Once a boot has succeeded, later runs change nothing.
package firstboot

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"path"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kilnproject/kiln/initd/config"
	"github.com/kilnproject/kiln/initd/source"
)

// Options configure Run. The zero value works on a real node.
type Options struct {
	// Root is the node's root directory; "" means "/". Tests use a temporary directory.
	Root string
	// Providers are the config sources, asked in this order (see source.Select).
	Providers []source.Provider
	// SourceTimeout bounds each provider; 0 means 30s.
	SourceTimeout time.Duration
	// Log receives progress; nil discards it.
	Log *slog.Logger
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Version is kiln-init's version, recorded in the status.
	Version string
}

// NoSource is the status source when no provider had a config.
const NoSource = "none"

// Run performs the first boot. When an earlier run succeeded it returns that run's
// status with Skipped set and touches nothing. Otherwise it fetches, parses, validates and
// applies the config, writes the status (state ok or failed) and syncs the filesystems.
// On failure it returns the failed status together with the error, so the caller can
// print Status.Line in every case (the status is nil only if the root cannot be opened).
func Run(ctx context.Context, opts Options) (*Status, error) {
	opts = withDefaults(opts)
	t, err := openTree(opts.Root)
	if err != nil {
		return nil, fmt.Errorf("firstboot: %w", err)
	}
	defer t.Close()

	switch prev, err := t.readStatus(); {
	case err == nil && prev.State == StateOK:
		prev.Skipped = true
		opts.Log.Info("first boot already done", "finished", prev.Finished, "source", prev.Source)
		return prev, nil
	case err == nil:
		opts.Log.Info("previous first boot did not succeed; running again", "state", prev.State, "error", prev.Error)
	case !statusMissing(err):
		opts.Log.Warn("unreadable first-boot status; running again", "error", err)
	}

	st := &Status{
		Started: opts.Now().UTC(),
		Files:   []FileStatus{},
		Version: opts.Version,
	}
	runErr := apply(ctx, t, opts, st)
	st.Finished = opts.Now().UTC()
	st.DurationMS = st.Finished.Sub(st.Started).Milliseconds()
	st.State = StateOK
	if runErr != nil {
		st.State, st.Error = StateFailed, runErr.Error()
	}
	if err := t.writeStatus(st); err != nil {
		err = fmt.Errorf("record first-boot status: %w", err)
		if runErr == nil {
			st.State, st.Error = StateFailed, err.Error()
		}
		runErr = errors.Join(runErr, err)
	}
	unix.Sync()
	if runErr != nil {
		opts.Log.Error("first boot failed", "error", runErr)
		return st, runErr
	}
	opts.Log.Info("first boot done", "source", st.Source, "files", len(st.Files), "duration", st.Duration())
	return st, nil
}

func withDefaults(o Options) Options {
	if o.Root == "" {
		o.Root = "/"
	}
	if o.SourceTimeout == 0 {
		o.SourceTimeout = 30 * time.Second
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return o
}

// apply gets the config and writes its files, filling in st.Source and st.Files.
func apply(ctx context.Context, t *tree, opts Options, st *Status) error {
	raw, src, err := source.Select(ctx, opts.Providers, opts.SourceTimeout)
	if err != nil {
		return err
	}
	if len(raw) == 0 {
		st.Source = NoSource
		opts.Log.Info("no config found", "sources", providerNames(opts.Providers))
		return nil
	}
	st.Source = src
	opts.Log.Info("config found", "source", src, "bytes", len(raw))

	cfg, err := config.Parse(raw)
	if err != nil {
		return fmt.Errorf("config from %s: %w", src, err)
	}
	for _, w := range cfg.Warnings {
		opts.Log.Warn("config warning", "source", src, "warning", w)
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("config from %s: %w", src, err)
	}
	// Resolve every file (decode, decompress, verify) before writing any.
	files, err := cfg.Files()
	if err != nil {
		return fmt.Errorf("config from %s: %w", src, err)
	}
	for _, f := range files {
		fst, err := t.applyFile(f)
		if err != nil {
			return fmt.Errorf("%s (%s): %w", f.Field, f.Path, err)
		}
		opts.Log.Info("wrote file", "path", fst.Path, "mode", fst.Mode, "sha256", fst.SHA256)
		st.Files = append(st.Files, fst)
	}
	return nil
}

func providerNames(ps []source.Provider) []string {
	names := make([]string, len(ps))
	for i, p := range ps {
		names[i] = p.Name()
	}
	return names
}

// applyFile writes one storage.files entry with Ignition's rules: without overwrite an
// existing node is an error, except that an entry without contents leaves an existing
// regular file's contents alone (applying mode if given); without contents a missing
// file is created empty. kiln adds one rule so that re-runs converge: an existing
// regular file that already holds the wanted contents is accepted (its mode is set).
func (t *tree) applyFile(f config.File) (FileStatus, error) {
	dir, base, err := t.split(f.Path)
	if err != nil {
		return FileStatus{}, err
	}
	target := path.Join(dir, base)
	fi, err := t.root.Lstat(target)
	exists := err == nil
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return FileStatus{}, fmt.Errorf("stat: %w", err)
	}

	switch {
	case exists && !f.HasContents:
		if !fi.Mode().IsRegular() {
			return FileStatus{}, fmt.Errorf("exists and is not a regular file (%s)", fi.Mode().Type())
		}
		if f.ModeSet {
			if err := t.root.Chmod(target, f.Mode); err != nil {
				return FileStatus{}, fmt.Errorf("chmod: %w", err)
			}
		}
		data, err := t.root.ReadFile(target)
		if err != nil {
			return FileStatus{}, err
		}
		return t.fileStatus(f.Path, target, data)
	case exists && !f.Overwrite:
		// A retry after a failed boot finds the files it wrote before: identical
		// contents count as done, so the retry converges.
		if fi.Mode().IsRegular() {
			if cur, err := t.root.ReadFile(target); err == nil && bytes.Equal(cur, f.Contents) {
				if err := t.root.Chmod(target, fileMode(f)); err != nil {
					return FileStatus{}, fmt.Errorf("chmod: %w", err)
				}
				return t.fileStatus(f.Path, target, cur)
			}
		}
		return FileStatus{}, errors.New("already exists with other contents and overwrite is false")
	case exists && fi.IsDir():
		return FileStatus{}, errors.New("is a directory; kiln does not replace directories with files")
	}

	if err := t.writeFile(dir, base, f.Contents, fileMode(f)); err != nil {
		return FileStatus{}, err
	}
	return t.fileStatus(f.Path, target, f.Contents)
}

// fileMode is the mode a written file gets: the config's, else 0644.
func fileMode(f config.File) fs.FileMode {
	if f.ModeSet {
		return f.Mode
	}
	return 0o644
}

func (t *tree) fileStatus(p, target string, data []byte) (FileStatus, error) {
	fi, err := t.root.Lstat(target)
	if err != nil {
		return FileStatus{}, fmt.Errorf("stat: %w", err)
	}
	sum := sha256.Sum256(data)
	return FileStatus{Path: p, SHA256: hex.EncodeToString(sum[:]), Mode: modeString(fi.Mode())}, nil
}

// modeString renders a mode as the octal Unix permission bits, e.g. "0644" or "4755".
func modeString(m fs.FileMode) string {
	bits := uint32(m.Perm())
	if m&fs.ModeSetuid != 0 {
		bits |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		bits |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		bits |= 0o1000
	}
	return fmt.Sprintf("%04o", bits)
}
