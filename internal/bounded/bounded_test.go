package bounded

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

var errOver = errors.New("over the cap")

func TestReadAll(t *testing.T) {
	errRead := errors.New("broken stream")
	tests := []struct {
		name    string
		r       io.Reader
		limit   int64
		want    string
		wantErr error
	}{
		{name: "under the cap", r: strings.NewReader("abc"), limit: 4, want: "abc"},
		{name: "exactly the cap", r: strings.NewReader("abcd"), limit: 4, want: "abcd"},
		{name: "one byte over", r: strings.NewReader("abcde"), limit: 4, wantErr: errOver},
		{name: "far over", r: bytes.NewReader(make([]byte, 1<<20)), limit: 4, wantErr: errOver},
		{name: "empty", r: strings.NewReader(""), limit: 0, want: ""},
		{name: "zero cap, one byte", r: strings.NewReader("a"), limit: 0, wantErr: errOver},
		{name: "negative cap", r: strings.NewReader("a"), limit: -1, wantErr: errOver},
		{name: "one byte at a time", r: iotest.OneByteReader(strings.NewReader("abcd")), limit: 4, want: "abcd"},
		{name: "read error", r: iotest.ErrReader(errRead), limit: 4, wantErr: errRead},
		{name: "read error at the cap", r: io.MultiReader(strings.NewReader("abcd"), iotest.ErrReader(errRead)), limit: 4, wantErr: errRead},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ReadAll(tt.r, tt.limit, errOver)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("ReadAll = %q, %v; want error %v", got, err, tt.wantErr)
			}
			if tt.wantErr == nil && string(got) != tt.want {
				t.Errorf("ReadAll = %q; want %q", got, tt.want)
			}
		})
	}
}

// TestReaderStaysFailed: once over the cap, every read fails, and no byte past the cap is
// ever passed on.
func TestReaderStaysFailed(t *testing.T) {
	b := NewReader(strings.NewReader("abcdef"), 3, errOver)
	p := make([]byte, 10)
	if n, err := b.Read(p); n != 3 || err != nil || string(p[:n]) != "abc" {
		t.Fatalf("first Read = %d %q, %v; want the 3 bytes under the cap", n, p[:n], err)
	}
	for i := 0; i < 3; i++ {
		if n, err := b.Read(p); n != 0 || err != errOver {
			t.Fatalf("Read %d past the cap = %d, %v; want 0, %v", i, n, err, errOver)
		}
	}
}
