package config

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"

	"github.com/coreos/ignition/v2/config/v3_6/types"
	"github.com/coreos/ignition/v2/config/validate"
	"github.com/vincent-petithory/dataurl"

	"github.com/kilnproject/kiln/initd/source"
	"github.com/kilnproject/kiln/internal/decompress"
	"github.com/kilnproject/kiln/internal/fetch"
)

// MaxReferenceDepth bounds how deep referenced configs nest: a config referencing one that
// references another, and so on.
const MaxReferenceDepth = 10

// MaxReferencedSize bounds all the configs one config references, directly or through
// others, together (decoded and decompressed), as MaxFilesSize bounds its files.
const MaxReferencedSize = MaxFilesSize

// RenderOptions tell Render how to get referenced configs.
type RenderOptions struct {
	// Get fetches http, https and tftp sources (URLGetter); nil fails on them.
	Get Getter
	// Unreachable, when set, is told of a referenced config whose source could not be
	// fetched (field is its JSON path, behind the references that led to it; source as
	// errors name it; err what Get returned), which is then left out and Render goes on:
	// `kiln check-config` checks what it can reach. nil makes it an error. A source that
	// answered wrongly (over the cap, a refused redirect) and a config that was fetched and is
	// wrong (its hash, its contents) are errors either way.
	Unreachable func(field, source string, err error)
}

// Render resolves the config's references as Ignition does before it applies a config:
// ignition.config.replace's config takes the place of this one; otherwise each
// ignition.config.merge entry's config is merged over it (Merge), in order. A referenced
// config is decoded (data:) or fetched (http, https, tftp through o.Get), decompressed,
// checked against its verification.hash, parsed (Ignition JSON or Butane) and validated, and
// its own references are rendered the same way, at most MaxReferenceDepth deep; a config that
// references itself, directly or through others, is an error, and so are referenced configs
// that together exceed MaxReferencedSize.
//
// Errors name each reference by JSON path and source, the outer first:
// "ignition.config.merge[0] (https://h/node.ign): storage.files[0].mode: …". Call Validate
// first; the result is validated again, as configs that are valid alone may clash once merged.
// As Ignition's, the result keeps the ignition.config fields it was rendered from;
// Referenced lists the sources it followed. A config without references is returned as it is.
func (c *Config) Render(ctx context.Context, o RenderOptions) (*Config, error) {
	r := &renderer{RenderOptions: o, left: MaxReferencedSize}
	out, err := r.render(ctx, c, "", nil)
	if err != nil || out == c {
		return out, err
	}
	out.Referenced = r.followed
	// Each config was valid alone; merged, two may clash (a file and a link at one path).
	err = out.Validate()
	if msg := reportErrors(validate.ValidateWithContext(out.Ignition, nil)); msg != "" {
		err = errors.Join(errors.New(msg), err)
	}
	if err != nil {
		return nil, fmt.Errorf("the config with the configs it references (%s): %w", strings.Join(out.Referenced, ", "), err)
	}
	return out, nil
}

// renderer is one Render: what the cap on referenced configs still leaves, and the sources
// followed so far.
type renderer struct {
	RenderOptions
	left     int64
	followed []string
}

// render resolves c's references; at names the references that led to c (for errors), chain
// their sources.
func (r *renderer) render(ctx context.Context, c *Config, at string, chain []string) (*Config, error) {
	refs := c.Ignition.Ignition.Config
	if refs.Replace.Source != nil {
		next, err := r.follow(ctx, at, "ignition.config.replace", refs.Replace, chain)
		if err != nil || next == nil {
			return c, err
		}
		return next, nil
	}
	out := c
	for i, ref := range refs.Merge {
		next, err := r.follow(ctx, at, fmt.Sprintf("ignition.config.merge[%d]", i), ref, chain)
		if err != nil {
			return nil, err
		}
		if next != nil {
			out = Merge(out, next)
		}
	}
	return out, nil
}

// follow gets, checks and renders the config ref names (at JSON path field of the config at
// at); nil when it could not be fetched and Unreachable took the error.
func (r *renderer) follow(ctx context.Context, at, field string, ref types.Resource, chain []string) (*Config, error) {
	src := deref(ref.Source)
	name := sourceName(src)
	if slices.Contains(chain, src) {
		loop := append(mapNames(chain), name)
		return nil, prefixed(at, &FieldError{Path: field + ".source", Err: fmt.Errorf("%s is one of the configs that led here: a loop (%s)", name, strings.Join(loop, " → "))})
	}
	if len(chain) >= MaxReferenceDepth {
		return nil, prefixed(at, &FieldError{Path: field + ".source", Err: fmt.Errorf("references nest more than %d deep", MaxReferenceDepth)})
	}
	raw, err := r.get(ctx, field, ref)
	var fe *fetchError
	if errors.As(err, &fe) && r.Unreachable != nil && !wrongAnswer(fe.cause) {
		r.Unreachable(at+field, name, fe.cause)
		return nil, nil
	}
	if err != nil {
		return nil, prefixed(at, err)
	}
	r.followed = append(r.followed, name)
	where := fmt.Sprintf("%s%s (%s): ", at, field, name)
	cfg, err := Parse(raw)
	if err == nil {
		err = cfg.Validate()
	}
	if err != nil {
		return nil, prefixed(where, err)
	}
	return r.render(ctx, cfg, where, append(slices.Clone(chain), src))
}

// get returns the bytes of the config ref names (at JSON path field): decoded or fetched,
// decompressed and checked against its hash, within what the cap on all referenced configs
// leaves.
func (r *renderer) get(ctx context.Context, field string, ref types.Resource) ([]byte, error) {
	src := deref(ref.Source)
	var data []byte
	if strings.HasPrefix(strings.ToLower(src), "data:") {
		du, err := dataurl.DecodeString(src)
		if err != nil {
			return nil, &FieldError{Path: field + ".source", Err: fmt.Errorf("decode data URL: %w", err)}
		}
		data = du.Data
	} else {
		switch {
		case ref.Verification.Hash == nil:
			return nil, &FieldError{Path: field + ".verification.hash", Err: errors.New("required for a remote source")}
		case r.Get == nil:
			return nil, &FieldError{Path: field + ".source", Err: fmt.Errorf("%s: remote sources are not fetched here", sourceName(src))}
		}
		got, err := r.Get(ctx, src)
		if err != nil {
			return nil, &fetchError{&FieldError{Path: field + ".source", Err: fmt.Errorf("fetch %s: %w", sourceName(src), err)}, err}
		}
		data = got
	}
	overAll := func() error {
		return &FieldError{Path: field, Err: fmt.Errorf("with this config, the configs referenced add up to more than the %d MiB cap on all of them", MaxReferencedSize>>20)}
	}
	out, err := decode(field, data, deref(ref.Compression), ref.Verification.Hash, r.left, overAll)
	if err == nil && decompress.ByMagic(out) == decompress.Gzip {
		// A gzip'd config (which Parse would gunzip) counts as what it unpacks to.
		var tl *TooLargeError
		if out, err = gunzip(out, min(MaxSize, r.left), "the gunzipped config"); errors.As(err, &tl) && r.left < MaxSize {
			err = overAll()
		} else if err != nil {
			err = &FieldError{Path: field, Err: fmt.Errorf("gzip'd config: %w", err)}
		}
	}
	if err != nil {
		return nil, err
	}
	r.left -= int64(len(out))
	return out, nil
}

// fetchError is a referenced config that could not be fetched (as opposed to one that was
// fetched and is wrong); cause is what the Getter returned.
type fetchError struct {
	*FieldError
	cause error
}

func (e *fetchError) Unwrap() error { return e.FieldError }

// wrongAnswer reports whether a failed fetch was answered, and wrongly: a body over the cap
// or a refused redirect is the source's fault wherever it is fetched from, not a source out
// of reach.
func wrongAnswer(err error) bool {
	var tooLarge *source.TooLargeError
	var redirect *fetch.RedirectError
	return errors.As(err, &tooLarge) || errors.As(err, &redirect)
}

// prefixed puts the references that led to a config before an error about it.
func prefixed(at string, err error) error {
	if at == "" {
		return err
	}
	return fmt.Errorf("%s%w", at, err)
}

// sourceName is a source as errors, logs and the status name it: a data: URL (which may
// hold secrets, and be long) as "data: URL", a password in a URL masked, and its query
// (which may be a signature, as in a presigned URL) as "?…".
func sourceName(src string) string {
	if strings.HasPrefix(strings.ToLower(src), "data:") {
		return "data: URL"
	}
	u, err := url.Parse(src)
	if err != nil {
		return "an unparsable URL"
	}
	if u.RawQuery != "" || u.ForceQuery {
		u.RawQuery, u.ForceQuery = "…", false
	}
	u.Fragment, u.RawFragment = "", ""
	return u.Redacted()
}

func mapNames(srcs []string) []string {
	names := make([]string, len(srcs))
	for i, s := range srcs {
		names[i] = sourceName(s)
	}
	return names
}

// checkReference checks ignition.config.replace or an ignition.config.merge entry (at JSON
// path field): the sources kiln fetches, and a hash for every remote one, as for files.
func checkReference(field string, ref types.Resource) []error {
	src := deref(ref.Source)
	if src == "" {
		if ref.Compression != nil || ref.Verification.Hash != nil {
			return []error{&FieldError{Path: field + ".source", Err: errors.New("is required")}}
		}
		return nil
	}
	u, err := url.Parse(src)
	if err != nil {
		return []error{&FieldError{Path: field + ".source", Err: err}}
	}
	var errs []error
	switch u.Scheme {
	case "data":
	case "http", "https", "tftp":
		if h := ref.Verification.Hash; h == nil || *h == "" {
			errs = append(errs, &FieldError{Path: field + ".verification.hash",
				Err: fmt.Errorf("required for a %s source: kiln verifies every downloaded byte (give sha256-<hex> or sha512-<hex> of the decompressed config)", u.Scheme)})
		}
		if u.Host == "" {
			errs = append(errs, &FieldError{Path: field + ".source", Err: fmt.Errorf("%s URL %q has no host", u.Scheme, src)})
		}
	default:
		errs = append(errs, &FieldError{Path: field + ".source",
			Err: unsupported(fmt.Sprintf("scheme %q is not supported by kiln yet (data:, http:, https: and tftp: are)", u.Scheme))})
	}
	if c := ref.Compression; c != nil && *c != "" && *c != "gzip" {
		errs = append(errs, &FieldError{Path: field + ".compression",
			Err: unsupported(fmt.Sprintf("compression %q is not supported (gzip is)", *c))})
	}
	return errs
}
