package imagestore

import (
	"bytes"
	"fmt"
	"os"
	"slices"
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
