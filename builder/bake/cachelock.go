package bake

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// cacheLockFile is the file in the cache's root that bakes hold shared and PruneCache holds
// alone (flock(2)): a prune never removes an entry a running bake is about to take, and bakes
// run side by side. The lock goes with its process; a bake that is killed holds nothing.
const cacheLockFile = ".kiln-lock"

// ErrCacheBusy is PruneCache's error when a bake holds the cache and PruneOptions.Wait is unset.
var ErrCacheBusy = errors.New("a bake is running on the cache")

// holdCache takes the lock of the cache at root: alone for a prune, else shared. A lock
// another process holds the other way is waited for when wait is set (waiting, if not nil,
// is called once first), else it is ErrCacheBusy. release lets it go.
func holdCache(root string, alone, wait bool, waiting func()) (release func(), err error) {
	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, fmt.Errorf("cache %s: %w", root, err)
	}
	p := filepath.Join(root, cacheLockFile)
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("cache lock: %w", err)
	}
	how := syscall.LOCK_SH
	if alone {
		how = syscall.LOCK_EX
	}
	err = flock(f, how|syscall.LOCK_NB)
	if errors.Is(err, syscall.EWOULDBLOCK) {
		if !wait {
			f.Close()
			return nil, fmt.Errorf("%s: %w", root, ErrCacheBusy)
		}
		if waiting != nil {
			waiting()
		}
		err = flock(f, how)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("cache lock %s: %w", p, err)
	}
	return func() { f.Close() }, nil
}

// flock is flock(2) on f, again when a signal interrupts it.
func flock(f *os.File, how int) error {
	for {
		err := syscall.Flock(int(f.Fd()), how)
		if !errors.Is(err, syscall.EINTR) {
			return err
		}
	}
}
