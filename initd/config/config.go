// Package config parses and checks the node's configuration.
//
// The user config is an Ignition v3 document (spec 3.0 to 3.6) or a Butane YAML document
// (variant fcos 1.0.0 to 1.7.0 or flatcar 1.0.0 to 1.1.0, translated to Ignition with the
// Butane library), either optionally gzip'd. The image's embedded default config is merged under it with
// Ignition's own merge rules (Merge). The configs a config references (ignition.config.merge
// and replace) are fetched, checked and merged in by Render, as Ignition does before it
// applies a config.
//
// kiln applies configs itself (Ignition's appliers are internal to Ignition; see package
// initd/apply). Validate refuses every part of a config that kiln does not apply, naming
// its JSON path, so that nothing the user asked for is silently ignored. For the same
// reason an unknown key, which Ignition and Butane only warn about, is an error here.
//
// The kiln node config, /etc/kiln/node.yaml, is the typed Node (see node.go and
// README.md in this directory).
//
// The builder imports this package (`kiln run --config` and `kiln cluster init` check and
// write node configs): parsing, checking and merging a config is node-side logic, and the
// builder runs it exactly as first boot does, so a config the builder accepts is one the node
// accepts. It is node code first and must never import builder/.
package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/coreos/ignition/v2/config/v3_6"
	"github.com/coreos/ignition/v2/config/v3_6/types"
	"github.com/coreos/vcontext/report"
	"github.com/coreos/vcontext/tree"

	"github.com/kilnproject/kiln/internal/bounded"
	"github.com/kilnproject/kiln/internal/decompress"
)

// MaxSize bounds a config after decompression, and the contents of one storage.files
// entry after decoding, decompression or download.
const MaxSize = 64 << 20

// MaxFilesSize bounds the contents of all storage.files entries of one config together,
// as kiln holds them in memory before it writes any: a config of small gzip'd data: URLs
// must not decompress into more than the node's memory.
const MaxFilesSize = 128 << 20

// TooLargeError is data over one of the caps above.
type TooLargeError struct {
	// What is over the cap, e.g. "the gzip'd config".
	What  string
	Limit int64
}

func (e *TooLargeError) Error() string {
	return fmt.Sprintf("%s is larger than the %d MiB cap", e.What, e.Limit>>20)
}

// FilesTotalError is the error for the storage.files entry (at JSON path field) whose
// contents take the sum over MaxFilesSize.
func FilesTotalError(field string) error {
	return &FieldError{Path: field + ".contents", Err: fmt.Errorf(
		"with this entry, the contents of storage.files add up to more than the %d MiB cap on all of them", MaxFilesSize>>20)}
}

// Config is a parsed user config.
type Config struct {
	// Ignition is the config translated to the newest spec kiln knows (3.5).
	Ignition types.Config
	// Warnings are the non-fatal findings of Ignition's validation (and of the Butane
	// translation), one per line, e.g.
	// "storage.files[0].mode: setuid/setgid/sticky bits are not supported".
	Warnings []string
	// Referenced are the sources of the configs Render followed (ignition.config.merge and
	// replace), in order, a data: URL as "data: URL".
	Referenced []string
}

// Parse decodes raw user data: Ignition JSON of spec version 3.0 to 3.6, or Butane YAML
// (variant fcos 1.0.0 to 1.7.0, flatcar 1.0.0 to 1.1.0), plain or gzip'd. Input whose first non-blank
// byte is "{" is taken as JSON, anything else as Butane. Any error Ignition's validation
// or the Butane translation reports is returned as an error with its JSON path (YAML
// path for Butane) and line and column; warnings are kept in Config.Warnings.
func Parse(raw []byte) (*Config, error) {
	return ParseWith(raw, Options{})
}

// ParseWith is Parse with Options: a Butane document's `local` keys are read from
// o.FilesDir.
func ParseWith(raw []byte, o Options) (*Config, error) {
	data, err := gunzipped(raw)
	if err != nil {
		return nil, err
	}
	trimmed := bytes.TrimSpace(bytes.TrimPrefix(data, utf8BOM))
	if len(trimmed) == 0 {
		return nil, errors.New("parse config: config is empty")
	}
	var warnings []string
	isButane := trimmed[0] != '{'
	if isButane {
		js, warns, err := translateButane(data, o)
		if err != nil {
			return nil, fmt.Errorf("parse config: %w", err)
		}
		data, warnings = js, warns
	} else if err := checkIgnitionVersion(data); err != nil {
		return nil, fmt.Errorf("parse config: %w", err)
	}
	cfg, rpt, err := v3_6.ParseCompatibleVersion(data)
	strict(&rpt)
	if isButane {
		// The translation validated the config already and reported with YAML
		// lines; lines of the generated JSON would only confuse.
		for i := range rpt.Entries {
			rpt.Entries[i].Marker = tree.Marker{}
		}
	}
	if err != nil {
		if msg := reportErrors(rpt); msg != "" {
			return nil, fmt.Errorf("parse config: %w: %s", err, msg)
		}
		return nil, fmt.Errorf("parse config: %w", err)
	}
	if msg := reportErrors(rpt); msg != "" {
		// ParseCompatibleVersion fails on fatal reports; be strict about any error
		// entry that slips through anyway (and about unknown keys, see strict).
		return nil, fmt.Errorf("parse config: %s", msg)
	}
	if !isButane {
		warnings = append(warnings, reportLines(rpt, report.Warn)...)
	}
	return &Config{Ignition: cfg, Warnings: warnings}, nil
}

// JSON renders the config as Ignition spec 3.6 JSON.
func (c *Config) JSON() ([]byte, error) {
	out, err := json.Marshal(c.Ignition)
	if err != nil {
		return nil, fmt.Errorf("render config: %w", err)
	}
	return out, nil
}

// Merge returns base with user merged over it by Ignition's rules (v3_6.Merge): lists
// are merged by key (a file path, a unit name, a user name…) with user's entries winning,
// single values set in user replace base's. Either may be nil. The warnings of both are
// kept, and so are the sources Render followed for either. The result should be validated
// again.
func Merge(base, user *Config) *Config {
	switch {
	case base == nil && user == nil:
		return nil
	case base == nil:
		return user
	case user == nil:
		return base
	}
	return &Config{Ignition: v3_6.Merge(base.Ignition, user.Ignition),
		Warnings: append(append([]string{}, base.Warnings...), user.Warnings...), Referenced: slices.Concat(base.Referenced, user.Referenced)}
}

var utf8BOM = []byte{0xef, 0xbb, 0xbf}

// strict turns two warnings into errors: an unknown key is a setting the user asked for
// that would otherwise be silently ignored, and a mode written in decimal (644 for
// 0644) would be applied as nonsense bits.
func strict(r *report.Report) {
	for i, e := range r.Entries {
		if e.Kind == report.Warn && (strings.HasPrefix(e.Message, "unused key") || strings.HasPrefix(e.Message, "unreasonable mode")) {
			r.Entries[i].Kind = report.Error
		}
	}
}

func gunzipped(raw []byte) ([]byte, error) {
	if decompress.ByMagic(raw) != decompress.Gzip {
		return raw, nil
	}
	data, err := gunzip(raw, MaxSize, "the gunzipped config")
	if err != nil {
		return nil, fmt.Errorf("parse config: gzip'd config: %w", err)
	}
	return data, nil
}

// gunzip decompresses data, failing with a *TooLargeError naming what once the output
// goes over limit; it never holds more than limit+1 bytes of output.
func gunzip(data []byte, limit int64, what string) ([]byte, error) {
	zr, err := decompress.Open(bytes.NewReader(data), decompress.Gzip)
	if err != nil {
		return nil, err
	}
	defer zr.Close()
	return bounded.ReadAll(zr, limit, &TooLargeError{What: what, Limit: limit})
}

func reportErrors(r report.Report) string {
	return strings.Join(reportLines(r, report.Error), "; ")
}

func reportLines(r report.Report, kind report.EntryKind) []string {
	var lines []string
	for _, e := range r.Entries {
		if e.Kind != kind {
			continue
		}
		msg := e.Message
		if p := jsonPath(e.Context.Path); p != "" {
			msg = p + ": " + msg
		}
		if e.Marker.StartP != nil {
			msg = fmt.Sprintf("%s (line %d col %d)", msg, e.Marker.StartP.Line, e.Marker.StartP.Column)
		}
		lines = append(lines, msg)
	}
	return lines
}

// jsonPath renders a vcontext path the way kiln names fields: storage.files[0].mode.
func jsonPath(elems []interface{}) string {
	var b strings.Builder
	for _, e := range elems {
		switch v := e.(type) {
		case int:
			fmt.Fprintf(&b, "[%d]", v)
		default:
			if b.Len() > 0 {
				b.WriteByte('.')
			}
			fmt.Fprint(&b, v)
		}
	}
	return b.String()
}
