package config

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io/fs"
	"path"
	"strings"

	"github.com/coreos/ignition/v2/config/v3_6/types"
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
	// Contents are the decoded, decompressed and verified bytes. For a remote source
	// they are nil until Fetch has run.
	Contents []byte
	// Source is the http(s) URL of contents still to be fetched (see Fetch); "" for a
	// data: URL (already decoded into Contents) and after Fetch.
	Source string
	// Compression ("" or "gzip") and Hash ("sha256-<hex>" or "sha512-<hex>" of the
	// decompressed bytes) describe a remote source for Fetch.
	Compression string
	Hash        string
	// User and Group own the file; the zero Owner means root.
	User, Group Owner
}

// Owner is a file's user or group, by numeric id or by name (looked up in the node's
// /etc/passwd or /etc/group when the file is written). The zero value is root (id 0).
type Owner struct {
	ID   *int
	Name string
}

// NodeUser and NodeGroup convert Ignition's owner fields.
func NodeUser(u types.NodeUser) Owner   { return Owner{ID: u.ID, Name: deref(u.Name)} }
func NodeGroup(g types.NodeGroup) Owner { return Owner{ID: g.ID, Name: deref(g.Name)} }

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// Getter fetches the body of an http, https or tftp URL (URLGetter). It should give up after
// MaxSize bytes.
type Getter func(ctx context.Context, url string) ([]byte, error)

// Remote reports whether the file's contents must still be fetched.
func (f File) Remote() bool { return f.Source != "" }

// Fetch resolves a remote source: it gets the bytes with get, decompresses them and
// checks them against Hash (required for remote sources; see Validate). A file that is
// not remote is returned as it is.
func (f File) Fetch(ctx context.Context, get Getter) (File, error) {
	if !f.Remote() {
		return f, nil
	}
	if f.Hash == "" {
		return File{}, &FieldError{Path: f.Field + ".contents.verification.hash", Err: errors.New("required for http(s) sources")}
	}
	if get == nil {
		return File{}, &FieldError{Path: f.Field + ".contents.source", Err: errors.New("no way to fetch remote sources was given")}
	}
	data, err := get(ctx, f.Source)
	if err != nil {
		return File{}, &FieldError{Path: f.Field + ".contents.source", Err: fmt.Errorf("fetch %s: %w", f.Source, err)}
	}
	data, err = decode(f.Field+".contents", data, f.Compression, &f.Hash, MaxSize, nil)
	if err != nil {
		return File{}, err
	}
	f.Contents, f.Source = data, ""
	return f, nil
}

// Files decodes the contents of every storage.files entry: data: URL, gzip
// decompression, and contents.verification.hash (checked on the decompressed bytes, as
// Ignition does). http(s) sources are left for File.Fetch (Source set, Contents nil).
// It fails on the first entry that cannot be resolved, before anything is written: one
// whose contents are over MaxSize, or take the sum of all contents over MaxFilesSize.
// Call Validate first: Files assumes only supported fields are set.
func (c *Config) Files() ([]File, error) {
	files := make([]File, 0, len(c.Ignition.Storage.Files))
	var total int64
	for i, f := range c.Ignition.Storage.Files {
		field := fmt.Sprintf("storage.files[%d]", i)
		rf, err := resolve(field, f, MaxFilesSize-total)
		if err != nil {
			return nil, err
		}
		total += int64(len(rf.Contents))
		files = append(files, rf)
	}
	return files, nil
}

// resolve decodes one entry; left is what MaxFilesSize leaves for its contents.
func resolve(field string, f types.File, left int64) (File, error) {
	out := File{
		Field:     field,
		Path:      path.Clean("/" + f.Path),
		Overwrite: f.Overwrite != nil && *f.Overwrite,
		User:      NodeUser(f.User),
		Group:     NodeGroup(f.Group),
	}
	if f.Mode != nil {
		m := *f.Mode
		if m < 0 || m > 0o7777 {
			return File{}, &FieldError{Path: field + ".mode", Err: fmt.Errorf("mode %#o is out of range", m)}
		}
		out.Mode, out.ModeSet = UnixMode(m), true
	}
	if len(f.Append) > 0 {
		return File{}, &FieldError{Path: field + ".append", Err: errUnsupported}
	}
	src := f.Contents.Source
	if src == nil || *src == "" {
		if f.Contents.Verification.Hash != nil {
			return File{}, &FieldError{Path: field + ".contents.verification.hash", Err: errors.New("a hash needs a contents.source")}
		}
		return out, nil
	}
	out.HasContents = true
	if lower := strings.ToLower(*src); strings.HasPrefix(lower, "http://") || strings.HasPrefix(lower, "https://") {
		out.Source = *src
		out.Compression = deref(f.Contents.Compression)
		out.Hash = deref(f.Contents.Verification.Hash)
		return out, nil
	}
	if !strings.HasPrefix(strings.ToLower(*src), "data:") {
		return File{}, &FieldError{Path: field + ".contents.source", Err: unsupported("only data:, http: and https: URLs are supported")}
	}
	du, err := dataurl.DecodeString(*src)
	if err != nil {
		return File{}, &FieldError{Path: field + ".contents.source", Err: fmt.Errorf("decode data URL: %w", err)}
	}
	data, err := decode(field+".contents", du.Data, deref(f.Contents.Compression), f.Contents.Verification.Hash, left,
		func() error { return FilesTotalError(field) })
	if err != nil {
		return File{}, err
	}
	out.Contents = data
	return out, nil
}

// decode decompresses the contents of the resource at JSON path at (a file's
// "storage.files[0].contents", a referenced config's "ignition.config.merge[0]") and verifies
// them against hash (if not nil). They may not exceed MaxSize, nor left, what a cap on several
// resources together leaves them: decompression stops at the smaller of the two, and overAll
// is the error for going over left.
func decode(at string, data []byte, compression string, hash *string, left int64, overAll func() error) ([]byte, error) {
	limit := int64(MaxSize)
	tooLarge := func() error { return &FieldError{Path: at, Err: &TooLargeError{What: "the contents", Limit: MaxSize}} }
	if left < limit {
		limit, tooLarge = max(left, 0), overAll
	}
	var err error
	switch compression {
	case "":
		if int64(len(data)) > limit {
			return nil, tooLarge()
		}
	case "gzip":
		data, err = gunzip(data, limit, "the contents")
		var tl *TooLargeError
		if errors.As(err, &tl) {
			return nil, tooLarge()
		}
		if err != nil {
			return nil, &FieldError{Path: at, Err: fmt.Errorf("gunzip: %w", err)}
		}
	default:
		return nil, &FieldError{Path: at + ".compression", Err: unsupported(fmt.Sprintf("compression %q is not supported (gzip is)", compression))}
	}
	if err := verify(types.Verification{Hash: hash}, data); err != nil {
		return nil, &FieldError{Path: at + ".verification.hash", Err: err}
	}
	return data, nil
}

// VerifyHash checks data against an Ignition verification hash, "sha256-<hex>" or
// "sha512-<hex>".
func VerifyHash(hash string, data []byte) error {
	return verify(types.Verification{Hash: &hash}, data)
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
		return fmt.Errorf("hash function %q is %w (sha256 and sha512 are)", fn, errUnsupported)
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

// UnixMode converts Unix permission bits (as Ignition gives them) to an fs.FileMode.
func UnixMode(m int) fs.FileMode {
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
