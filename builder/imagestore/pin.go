package imagestore

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/opencontainers/go-digest"
	bolt "go.etcd.io/bbolt"
)

// The keys containerd's metadata and snapshot databases keep record times under.
var timeKeys = [][]byte{[]byte("createdat"), []byte("updatedat")}

// pinAndCompact sets every record time of the bolt database at path to t and rewrites the
// database compacted, so that two bakes of the same images give the same bytes.
func pinAndCompact(path string, t time.Time) error {
	stamp, err := t.UTC().MarshalBinary()
	if err != nil {
		return err
	}
	db, err := bolt.Open(path, 0o644, &bolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		return err
	}
	err = db.Update(func(tx *bolt.Tx) error {
		return tx.ForEach(func(_ []byte, b *bolt.Bucket) error { return pinBucket(b, stamp) })
	})
	if err != nil {
		db.Close()
		return fmt.Errorf("pin record times: %w", err)
	}
	tmp := path + ".compact"
	os.Remove(tmp)
	dst, err := bolt.Open(tmp, 0o644, &bolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		db.Close()
		return err
	}
	// One transaction per key: bolt spills the buckets a transaction touched in map order, so a
	// transaction touching several would place their pages differently from run to run.
	err = bolt.Compact(dst, db, 1)
	db.Close()
	if cerr := dst.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("compact: %w", err)
	}
	return os.Rename(tmp, path)
}

// pinBucket sets the time keys of b and of every bucket below it to stamp.
func pinBucket(b *bolt.Bucket, stamp []byte) error {
	var nested [][]byte
	err := b.ForEach(func(k, v []byte) error {
		if v == nil {
			nested = append(nested, bytes.Clone(k))
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, k := range timeKeys {
		if v := b.Get(k); v != nil {
			if err := b.Put(k, stamp); err != nil {
				return err
			}
		}
	}
	for _, k := range nested {
		if err := pinBucket(b.Bucket(k), stamp); err != nil {
			return err
		}
	}
	return nil
}

// sortedDigests lists m's keys in order.
func sortedDigests[V any](m map[digest.Digest]V) []digest.Digest {
	out := make([]digest.Digest, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// treeSize is what a snapshot of the tree dir takes on a filesystem of 4 KiB blocks, counted
// from its entries' sizes: each directory and each regular file (once per inode) in whole
// blocks, symlinks in their inode. The snapshotter records what the host allocated instead,
// and that depends on when the host wrote the files back: two bakes of the same images would
// differ in it.
func treeSize(dir string) (int64, error) {
	const block = 4096
	type inode struct{ dev, ino uint64 }
	seen := map[inode]bool{}
	var size int64
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case fi.IsDir():
			size += block
		case fi.Mode().IsRegular():
			if st, ok := fi.Sys().(*syscall.Stat_t); ok {
				k := inode{uint64(st.Dev), st.Ino}
				if seen[k] {
					return nil
				}
				seen[k] = true
			}
			size += (fi.Size() + block - 1) / block * block
		}
		return nil
	})
	return size, err
}

// setSnapshotSizes sets the size the overlayfs snapshotter's database at path records for
// each committed snapshot named by a chain ID in sizes (see treeSize).
func setSnapshotSizes(path string, sizes map[digest.Digest]int64) error {
	db, err := bolt.Open(path, 0o644, &bolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		return err
	}
	err = db.Update(func(tx *bolt.Tx) error {
		snaps := tx.Bucket([]byte("v1"))
		if snaps != nil {
			snaps = snaps.Bucket([]byte("snapshots"))
		}
		if snaps == nil {
			return errors.New("no v1/snapshots bucket")
		}
		set := 0
		err := snaps.ForEach(func(k, v []byte) error {
			name := string(k)
			for chainID, size := range sizes {
				if v == nil && strings.HasSuffix(name, "/"+chainID.String()) {
					set++
					return snaps.Bucket(k).Put([]byte("size"), binary.AppendVarint(nil, size))
				}
			}
			return nil
		})
		if err == nil && set != len(sizes) {
			err = fmt.Errorf("%d of %d snapshots found", set, len(sizes))
		}
		return err
	})
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("%s: snapshot sizes: %w", path, err)
	}
	return nil
}
