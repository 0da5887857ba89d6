package aws

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"sync/atomic"
	"time"

	sdkaws "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ebs"
	ebstypes "github.com/aws/aws-sdk-go-v2/service/ebs/types"
	"golang.org/x/sync/errgroup"

	"github.com/kilnproject/kiln/builder/publish"
)

// blockSize is the size of an EBS snapshot block, the unit of PutSnapshotBlock.
const blockSize = 512 << 10

// UploadProgress is how far an upload is.
type UploadProgress struct {
	Blocks   int64 // blocks of the disk
	Uploaded int64 // blocks written to the snapshot
	Skipped  int64 // blocks of zeros, which a snapshot need not hold
	Bytes    int64 // bytes uploaded
	Elapsed  time.Duration
	Last     bool // the last report of the upload, whether it succeeded or not
	Done     bool // the snapshot holds every block and is completed: the last report of an upload that succeeded
}

// MiBps is the upload's throughput: MiB of data uploaded per second.
func (p UploadProgress) MiBps() float64 {
	if p.Elapsed <= 0 {
		return 0
	}
	return float64(p.Bytes) / (1 << 20) / p.Elapsed.Seconds()
}

type uploaded struct {
	SnapshotID string
	Progress   UploadProgress
}

// upload writes im into a new snapshot through the EBS direct APIs and completes it. On
// failure it deletes the snapshot, or says that it is left.
func (a *Publisher) upload(ctx context.Context, im *publish.Image, r Request) (*uploaded, error) {
	f, err := os.Open(im.Path)
	if err != nil {
		return nil, fmt.Errorf("publish aws: %w", err)
	}
	defer f.Close()
	var tags []ebstypes.Tag
	for _, t := range r.tags(im) {
		tags = append(tags, ebstypes.Tag{Key: sdkaws.String(t.key), Value: sdkaws.String(t.value)})
	}
	start, err := a.EBS.StartSnapshot(ctx, &ebs.StartSnapshotInput{
		VolumeSize:  sdkaws.Int64(int64(volumeGiB(im))),
		Description: sdkaws.String(fmt.Sprintf("kiln %s sha256:%s", r.Name, im.SHA256)),
		Tags:        tags,
		ClientToken: sdkaws.String(rand.Text()),
	})
	if err != nil {
		return nil, apiErr(a.Region, "StartSnapshot", err)
	}
	id := sdkaws.ToString(start.SnapshotId)
	a.log().Info("publish aws: uploading", "snapshot", id, "region", a.Region, "file", im.Path)
	up := &blockUpload{a: a, snapshot: id, path: im.Path, blocks: (im.Output.Size + blockSize - 1) / blockSize}
	if err := up.run(ctx, f, im.SHA256); err != nil {
		return nil, a.undo(ctx, a.EC2, a.Region, err, "", id)
	}
	return &uploaded{SnapshotID: id, Progress: up.progress(true, true)}, nil
}

// blockUpload is one snapshot's upload: blocks are read and hashed in order by one goroutine
// and put by Workers others.
type blockUpload struct {
	a        *Publisher
	snapshot string
	path     string
	blocks   int64
	began    time.Time
	// digests holds the SHA-256 of every block put, by index; put says which were.
	digests           [][sha256.Size]byte
	put               []bool
	uploaded, skipped atomic.Int64
}

type block struct {
	index int64
	data  []byte
}

// run uploads the blocks of f, checks f against digest and completes the snapshot. Its last
// progress report says done only when all of that succeeded.
func (u *blockUpload) run(ctx context.Context, f io.Reader, digest string) error {
	u.began = time.Now()
	u.digests, u.put = make([][sha256.Size]byte, u.blocks), make([]bool, u.blocks)
	workers := u.a.workers()
	g, gctx := errgroup.WithContext(ctx)
	todo := make(chan block, workers)
	free := make(chan []byte, 2*workers) // buffers come back here once put
	whole := sha256.New()
	g.Go(func() error { defer close(todo); return u.read(gctx, f, whole, todo, free) })
	for range workers {
		g.Go(func() error { return u.putBlocks(gctx, todo, free) })
	}
	stop := u.reportEvery(250 * time.Millisecond)
	err := g.Wait()
	if err == nil {
		err = checkDigest(u.path, whole, digest)
	}
	if err == nil {
		err = u.complete(ctx)
	}
	stop(err == nil)
	return err
}

// read sends the blocks of f that are not all zeros to todo, hashing all of f into whole.
// The last block, when f ends inside it, is padded with zeros.
func (u *blockUpload) read(ctx context.Context, f io.Reader, whole hash.Hash, todo chan<- block, free chan []byte) error {
	zero := make([]byte, blockSize)
	for i := range u.blocks {
		var buf []byte
		select {
		case buf = <-free:
		default:
			buf = make([]byte, blockSize)
		}
		n, err := io.ReadFull(f, buf)
		if err != nil && !(errors.Is(err, io.ErrUnexpectedEOF) && i == u.blocks-1) {
			return fmt.Errorf("publish aws: read block %d: %w", i, err)
		}
		whole.Write(buf[:n])
		clear(buf[n:])
		if bytes.Equal(buf, zero) {
			u.skipped.Add(1)
			select {
			case free <- buf:
			default:
			}
			continue
		}
		select {
		case todo <- block{i, buf}:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// putBlocks puts the blocks from todo until it is closed.
func (u *blockUpload) putBlocks(ctx context.Context, todo <-chan block, free chan<- []byte) error {
	for b := range todo {
		sum := sha256.Sum256(b.data)
		want := base64.StdEncoding.EncodeToString(sum[:])
		out, err := u.a.EBS.PutSnapshotBlock(ctx, &ebs.PutSnapshotBlockInput{
			SnapshotId:        sdkaws.String(u.snapshot),
			BlockIndex:        sdkaws.Int32(int32(b.index)),
			BlockData:         bytes.NewReader(b.data),
			DataLength:        sdkaws.Int32(blockSize),
			Checksum:          sdkaws.String(want),
			ChecksumAlgorithm: ebstypes.ChecksumAlgorithmChecksumAlgorithmSha256,
			Progress:          sdkaws.Int32(int32(100 * (b.index + 1) / u.blocks)),
		})
		if err != nil {
			return apiErr(u.a.Region, "PutSnapshotBlock", fmt.Errorf("block %d: %w", b.index, err))
		}
		if got := sdkaws.ToString(out.Checksum); got != want {
			return fmt.Errorf("publish aws: PutSnapshotBlock %d: EBS stored checksum %s, sent %s", b.index, got, want)
		}
		u.digests[b.index], u.put[b.index] = sum, true
		u.uploaded.Add(1)
		select {
		case free <- b.data:
		default:
		}
	}
	return nil
}

// complete completes the snapshot with the count of blocks put and their linear aggregate
// checksum: the SHA-256 of their SHA-256s in the order of their indexes.
func (u *blockUpload) complete(ctx context.Context) error {
	agg := sha256.New()
	var n int32
	for i, ok := range u.put {
		if ok {
			agg.Write(u.digests[i][:])
			n++
		}
	}
	out, err := u.a.EBS.CompleteSnapshot(ctx, &ebs.CompleteSnapshotInput{
		SnapshotId:                sdkaws.String(u.snapshot),
		ChangedBlocksCount:        sdkaws.Int32(n),
		Checksum:                  sdkaws.String(base64.StdEncoding.EncodeToString(agg.Sum(nil))),
		ChecksumAlgorithm:         ebstypes.ChecksumAlgorithmChecksumAlgorithmSha256,
		ChecksumAggregationMethod: ebstypes.ChecksumAggregationMethodChecksumAggregationLinear,
	})
	if err != nil {
		return apiErr(u.a.Region, "CompleteSnapshot", err)
	}
	if out.Status == ebstypes.StatusError {
		return fmt.Errorf("publish aws: CompleteSnapshot: snapshot %s is in error", u.snapshot)
	}
	return nil
}

// progress is the upload's progress now; last when it has ended, done when it succeeded.
func (u *blockUpload) progress(last, done bool) UploadProgress {
	n := u.uploaded.Load()
	return UploadProgress{Blocks: u.blocks, Uploaded: n, Skipped: u.skipped.Load(), Bytes: n * blockSize, Elapsed: time.Since(u.began), Last: last, Done: done}
}

// reportEvery calls Progress every interval until the returned stop is called, and once
// more then, the last report: done says whether the upload succeeded.
func (u *blockUpload) reportEvery(interval time.Duration) (stop func(done bool)) {
	if u.a.Progress == nil {
		return func(bool) {}
	}
	quit, finished := make(chan bool), make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				u.a.Progress(u.progress(false, false))
			case done := <-quit:
				u.a.Progress(u.progress(true, done))
				return
			}
		}
	}()
	return func(done bool) { quit <- done; <-finished }
}
