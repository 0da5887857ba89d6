package install

import (
	"bytes"
	"crypto/rand"
	"io"
	"log/slog"
	"os"
	"testing"
	"time"
)

// TestStaging: before commit the disk holds the image except its first and last MiB (zero);
// the view reads and writes the image as it will be; commit puts the rest in place.
func TestStaging(t *testing.T) {
	for _, tt := range []struct {
		name  string
		size  int
		chunk int
	}{
		{"just over the head", mib + 10, 4096},
		{"head and tail only", 2 * mib, mib},
		{"odd size, odd chunks", 3*mib + 777, 100_003},
		{"larger than the lag buffer", 7*mib + 1, 3 * mib},
	} {
		t.Run(tt.name, func(t *testing.T) {
			img := make([]byte, tt.size)
			rand.Read(img)
			f, err := os.OpenFile(sparseDisk(t, 8*mib), os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			st := newStaging(f, 8*mib, slog.New(slog.DiscardHandler), time.Hour)
			if _, err := io.CopyBuffer(st, bytes.NewReader(img), make([]byte, tt.chunk)); err != nil {
				t.Fatal(err)
			}
			disk := func() []byte {
				b := make([]byte, tt.size)
				if _, err := f.ReadAt(b, 0); err != nil {
					t.Fatal(err)
				}
				return b
			}
			v := st.view()
			tailOff := int(v.tailOff)
			want := append(make([]byte, headSize), img[headSize:tailOff]...)
			want = append(want, make([]byte, tt.size-tailOff)...)
			if !bytes.Equal(disk(), want) || tt.size-tailOff < min(tailSize, tt.size-headSize) {
				t.Fatalf("before commit the disk holds more than the image's middle, or less than its last MiB is held (tail of %d bytes at %d)", tt.size-tailOff, tailOff)
			}
			// Writes across both held parts through the view land in memory and on the disk.
			for _, off := range []int{headSize - 5, tailOff - 5, tt.size - 3} {
				patch := []byte("0123456789")[:min(10, tt.size-off)]
				if _, err := v.WriteAt(patch, int64(off)); err != nil {
					t.Fatal(err)
				}
				copy(img[off:], patch)
			}
			got := make([]byte, tt.size+10)
			if n, err := v.ReadAt(got, 0); n != tt.size || err != io.EOF || !bytes.Equal(got[:n], img) {
				t.Fatalf("view reads %d bytes (%v), equal to the image: %v", n, err, bytes.Equal(got[:n], img))
			}
			if err := st.commit(); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(disk(), img) {
				t.Error("after commit the disk does not hold the image")
			}
		})
	}
}
