package source

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/base64"
	"strings"
	"testing"

	"github.com/kilnproject/kiln/internal/decompress"
	"github.com/kilnproject/kiln/internal/testkit"
)

const butane = "variant: fcos\nversion: 1.6.0\nstorage:\n  files:\n    - path: /etc/motd\n"

func TestDecode(t *testing.T) {
	b64 := base64.StdEncoding.EncodeToString
	wrapped := func(s string) string { // base64 as `base64` prints it: 76 columns
		var b strings.Builder
		for len(s) > 76 {
			b.WriteString(s[:76] + "\n")
			s = s[76:]
		}
		return b.String() + s + "\n"
	}
	tests := []struct {
		name    string
		in      []byte
		want    string
		wantErr string
	}{
		{name: "empty", in: nil, want: ""},
		{name: "plain ignition", in: []byte(ign), want: ign},
		{name: "plain butane yaml", in: []byte(butane), want: butane},
		{name: "gzip ignition", in: testkit.Gzip(t, []byte(ign)), want: ign},
		{name: "base64 ignition", in: []byte(b64([]byte(ign))), want: ign},
		{name: "base64 butane, line-wrapped", in: []byte(wrapped(b64([]byte(butane + butane)))), want: butane + butane},
		{name: "base64 url alphabet, unpadded", in: []byte(base64.RawURLEncoding.EncodeToString([]byte("{\"a\":\"??>>\"}"))), want: "{\"a\":\"??>>\"}"},
		{name: "base64 of gzip", in: []byte(b64(testkit.Gzip(t, []byte(ign)))), want: ign},
		{name: "base64 of gzip of yaml", in: []byte(b64(testkit.Gzip(t, []byte(butane))) + "\n"), want: butane},
		// Words that happen to be valid base64 but decode to noise stay as they are.
		{name: "word that is valid base64", in: []byte("abcd"), want: "abcd"},
		{name: "base64 of binary noise kept", in: []byte(b64([]byte{0xff, 0xfe, 0x00, 0x01})), want: b64([]byte{0xff, 0xfe, 0x00, 0x01})},
		{name: "yaml scalar", in: []byte("hello world"), want: "hello world"},
		{name: "garbage", in: []byte("}{not json"), want: "}{not json"},
		{name: "invalid base64 padding kept", in: []byte("e30=="), want: "e30=="},
		{name: "corrupt gzip", in: append([]byte{0x1f, 0x8b}, "garbage"...), wantErr: "decode gzip user data"},
		{name: "truncated gzip", in: testkit.Gzip(t, []byte(ign))[:20], wantErr: "decode gzip user data"},
		{name: "base64 of corrupt gzip", in: []byte(b64(append([]byte{0x1f, 0x8b, 8}, "junk"...))), wantErr: "decode gzip user data"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Decode(tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Decode = %q, %v; want error %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if string(got) != tc.want {
				t.Errorf("Decode = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestDecodeGzipBomb(t *testing.T) {
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	chunk := make([]byte, 1<<20)
	for range MaxConfigSize>>20 + 1 {
		if _, err := zw.Write(chunk); err != nil {
			t.Fatal(err)
		}
	}
	zw.Close()
	if _, err := Decode(b.Bytes()); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Fatalf("Decode of a %d-byte gzip bomb: err = %v, want a size error", b.Len(), err)
	}
}

func TestSelectDecodes(t *testing.T) {
	tests := []struct {
		name, data, want, wantErr string
	}{
		{name: "base64 gzip from a source", data: base64.StdEncoding.EncodeToString(testkit.Gzip(t, []byte(ign))), want: ign},
		{name: "corrupt gzip stops the search", data: "\x1f\x8bjunk", wantErr: "config source a: decode gzip user data"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			data, src, err := Select(context.Background(), []Provider{
				stub{name: "a", present: true, data: tc.data},
				stub{name: "b", present: true, data: "B"},
			}, 0)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || string(data) != tc.want || src != "a" {
				t.Errorf("Select = %q from %q, %v; want %q from a", data, src, err, tc.want)
			}
		})
	}
}

func FuzzDecode(f *testing.F) {
	f.Add([]byte(ign))
	f.Add([]byte(butane))
	f.Add(testkit.Gzip(f, []byte(ign)))
	f.Add([]byte(base64.StdEncoding.EncodeToString(testkit.Gzip(f, []byte(butane)))))
	f.Add([]byte("e30="))
	f.Add([]byte{0x1f, 0x8b, 8, 0, 0, 0})
	f.Fuzz(func(t *testing.T, in []byte) {
		out, err := Decode(in)
		if err != nil {
			return
		}
		if len(out) > MaxConfigSize {
			t.Fatalf("Decode returned %d bytes, over MaxConfigSize", len(out))
		}
		// Text with '{' or ':' is never base64, so a plain config comes back
		// byte for byte unless it is gzip.
		if decompress.ByMagic(in) != decompress.Gzip && bytes.ContainsAny(in, "{:") && !bytes.Equal(out, in) {
			t.Fatalf("Decode changed non-base64 input %q to %q", in, out)
		}
	})
}
