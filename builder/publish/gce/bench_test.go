package gce

import (
	"context"
	"fmt"
	"os"
	"testing"
)

// BenchmarkPublishGCE publishes a gce tarball of incompressible data (so the tarball is as big
// as the data) to the Cloud Storage emulator and the compute fake: the SHA-256/CRC32C/MD5 pass,
// the resumable upload in 16 MiB chunks and images.insert. It reports the file's MiB/s.
func BenchmarkPublishGCE(b *testing.B) {
	env := newGCEEnv(b)
	file := gceOutput(b, 64)
	fi, err := os.Stat(file)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(fi.Size())
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		o := env.options(file, fmt.Sprintf("kiln-bench-%d", i))
		o.ChunkSize = 16 << 20
		if _, err := publishFile(context.Background(), o); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		env.compute.PutImage(nil) // so the next publish does not find this one
		b.StartTimer()
	}
	b.ReportMetric(float64(fi.Size())*float64(b.N)/(1<<20)/b.Elapsed().Seconds(), "MiB/s")
}

// BenchmarkGCESums is the local pass before an upload: SHA-256, CRC32C and MD5 of the file in
// one read, in MiB/s.
func BenchmarkGCESums(b *testing.B) {
	file := gceOutput(b, 64)
	fi, err := os.Stat(file)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(fi.Size())
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := sumFile(file); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(fi.Size())*float64(b.N)/(1<<20)/b.Elapsed().Seconds(), "MiB/s")
}
