package config

import (
	"bytes"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io/fs"
	"path"
	"strings"

	"github.com/coreos/ignition/v2/config/v3_5/types"
	"github.com/vincent-petithory/dataurl"
)

// File is one storage.files entry resolved to the bytes to write.
type File struct {
	// Field is the entry's JSON path, e.g. "storage.files[2]", for error messages.
	Field string
	// Path is the absolute, cleaned destination path.
	Path string
	// Mode is the permission mode to set, including setuid/setgid/sticky bits.
	// It is meaningful only when ModeSet is true.
	Mode    fs.FileMode
	ModeSet bool
	// Overwrite allows replacing whatever exists at Path.
	Overwrite bool
	// HasContents is false when the config gives no contents.source: the file is then
	// created empty if missing and otherwise left as it is.
	HasContents bool
	// Contents are the decoded, decompressed and verified bytes.
	Contents []byte
}

// Files decodes the contents of every storage.files entry: data: URL, gzip
// decompression, and contents.verification.hash (checked on the decompressed bytes, as
// Ignition does). It fails on the first entry that cannot be resolved, before anything is
// written. Call Validate first: Files assumes only supported fields are set.
func (c *Config) Files() ([]File, error) {
	files := make([]File, 0, len(c.Ignition.Storage.Files))
	for i, f := range c.Ignition.Storage.Files {
		rf, err := resolve(fmt.Sprintf("storage.files[%d]", i), f)
		if err != nil {
			return nil, err
		}
		files = append(files, rf)
	}
	return files, nil
}

func resolve(field string, f types.File) (File, error) {
	out := File{
		Field:     field,
		Path:      path.Clean("/" + f.Path),
		Overwrite: f.Overwrite != nil && *f.Overwrite,
	}
	if f.Mode != nil {
		m := *f.Mode
		if m < 0 || m > 0o7777 {
			return File{}, &FieldError{Path: field + ".mode", Err: fmt.Errorf("mode %#o is out of range", m)}
		}
		out.Mode, out.ModeSet = unixMode(uint32(m)), true
	}
	if len(f.Append) > 0 {
		return File{}, &FieldError{Path: field + ".append", Err: ErrUnsupported}
	}
	src := f.Contents.Source
	if src == nil || *src == "" {
		if f.Contents.Verification.Hash != nil {
			return File{}, &FieldError{Path: field + ".contents.verification.hash", Err: errors.New("a hash needs a contents.source")}
		}
		return out, nil
	}
	if !strings.HasPrefix(strings.ToLower(*src), "data:") {
		return File{}, &FieldError{Path: field + ".contents.source", Err: fmt.Errorf("only data: URLs are %w", ErrUnsupported)}
	}
	du, err := dataurl.DecodeString(*src)
	if err != nil {
		return File{}, &FieldError{Path: field + ".contents.source", Err: fmt.Errorf("decode data URL: %w", err)}
	}
	data := du.Data
	if c := f.Contents.Compression; c != nil && *c != "" {
		if *c != "gzip" {
			return File{}, &FieldError{Path: field + ".contents.compression", Err: fmt.Errorf("compression %q is %w", *c, ErrUnsupported)}
		}
		data, err = gunzip(data, MaxSize)
		if err != nil {
			return File{}, &FieldError{Path: field + ".contents", Err: fmt.Errorf("gunzip: %w", err)}
		}
	}
	if err := verify(f.Contents.Verification, data); err != nil {
		return File{}, &FieldError{Path: field + ".contents.verification.hash", Err: err}
	}
	out.HasContents, out.Contents = true, data
	return out, nil
}

// verify checks data against a "<function>-<hex digest>" hash, if one is given.
func verify(v types.Verification, data []byte) error {
	if v.Hash == nil {
		return nil
	}
	fn, want, ok := strings.Cut(*v.Hash, "-")
	if !ok {
		return fmt.Errorf("hash %q is not <function>-<hex digest>", *v.Hash)
	}
	var h hash.Hash
	switch fn {
	case "sha256":
		h = sha256.New()
	case "sha512":
		h = sha512.New()
	default:
		return fmt.Errorf("hash function %q is %w (sha256 and sha512 are)", fn, ErrUnsupported)
	}
	wantSum, err := hex.DecodeString(want)
	if err != nil || len(wantSum) != h.Size() {
		return fmt.Errorf("%s digest %q is not %d hex bytes", fn, want, h.Size())
	}
	h.Write(data)
	if got := h.Sum(nil); !bytes.Equal(got, wantSum) {
		return fmt.Errorf("%s mismatch: config says %s, contents are %s", fn, want, hex.EncodeToString(got))
	}
	return nil
}

// unixMode converts Unix permission bits (as Ignition gives them) to an fs.FileMode.
func unixMode(m uint32) fs.FileMode {
	mode := fs.FileMode(m & 0o777)
	if m&0o4000 != 0 {
		mode |= fs.ModeSetuid
	}
	if m&0o2000 != 0 {
		mode |= fs.ModeSetgid
	}
	if m&0o1000 != 0 {
		mode |= fs.ModeSticky
	}
	return mode
}
