package aws

import (
	"context"
	"testing"

	"github.com/kilnproject/kiln/builder/publish"
	"github.com/kilnproject/kiln/builder/publish/publishtest"
)

// BenchmarkPublishAWS publishes a 256 MiB disk, one block in four holding data, to the
// fakes, and reports the throughput of the data uploaded and the blocks skipped.
func BenchmarkPublishAWS(b *testing.B) {
	const size = 256 << 20
	data := map[int64][]byte{}
	for off := int64(0); off < size; off += 4 * blockSize {
		data[off] = randBytes(blockSize)
	}
	path, _ := publishtest.RawImage(b, b.TempDir(), size, data)
	im, err := publish.Load(path)
	if err != nil {
		b.Fatal(err)
	}
	var mibps float64
	var skipped int64
	for b.Loop() {
		_, a := newFakeAWS(b)
		res, err := a.publish(context.Background(), im, newRequest())
		if err != nil {
			b.Fatal(err)
		}
		mibps += res.Upload.MiBps()
		skipped = res.Upload.Skipped
	}
	b.ReportMetric(mibps/float64(b.N), "MiB/s")
	b.ReportMetric(float64(skipped), "blocks-skipped")
	b.ReportMetric(float64(size/blockSize-skipped), "blocks-put")
}
