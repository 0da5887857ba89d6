// Package config parses and checks the node's user config: an Ignition v3 document
// (spec 3.0 to 3.5, optionally gzip'd).
//
// kiln applies configs itself (Ignition's appliers are internal to Ignition), one feature
// at a time. Validate refuses every part of a config that kiln does not apply yet, naming
// its JSON path, so that nothing the user asked for is silently ignored.
package config

import (
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/coreos/ignition/v2/config/v3_5"
	"github.com/coreos/ignition/v2/config/v3_5/types"
	"github.com/coreos/vcontext/report"
)

// MaxSize bounds a config after decompression.
const MaxSize = 64 << 20

// Config is a parsed user config.
type Config struct {
	// Ignition is the config translated to the newest spec kiln knows (3.5).
	Ignition types.Config
	// Warnings are the non-fatal findings of Ignition's validation, one per line,
	// e.g. "storage.files[0].mode: setuid/setgid/sticky bits are not supported".
	Warnings []string
}

// Parse decodes raw user data: Ignition JSON of spec version 3.0 to 3.5, plain or gzip'd.
// Any error Ignition's own validation reports is returned as an error with its JSON
// path; warnings are kept in Config.Warnings.
func Parse(raw []byte) (*Config, error) {
	data, err := decompress(raw)
	if err != nil {
		return nil, err
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, errors.New("parse config: config is empty")
	}
	cfg, rpt, err := v3_5.ParseCompatibleVersion(data)
	if err != nil {
		if msg := reportErrors(rpt); msg != "" {
			return nil, fmt.Errorf("parse config: %w: %s", err, msg)
		}
		return nil, fmt.Errorf("parse config: %w", err)
	}
	if msg := reportErrors(rpt); msg != "" {
		// ParseCompatibleVersion fails on fatal reports; be strict about any error
		// entry that slips through anyway.
		return nil, fmt.Errorf("parse config: %s", msg)
	}
	return &Config{Ignition: cfg, Warnings: reportLines(rpt, report.Warn)}, nil
}

var gzipMagic = []byte{0x1f, 0x8b}

func decompress(raw []byte) ([]byte, error) {
	if !bytes.HasPrefix(raw, gzipMagic) {
		return raw, nil
	}
	data, err := gunzip(raw, MaxSize)
	if err != nil {
		return nil, fmt.Errorf("parse config: gzip'd config: %w", err)
	}
	return data, nil
}

// gunzip decompresses data, refusing output larger than limit.
func gunzip(data []byte, limit int64) ([]byte, error) {
	zr, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		return nil, err
	}
	defer zr.Close()
	out, err := io.ReadAll(io.LimitReader(zr, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(out)) > limit {
		return nil, fmt.Errorf("larger than %d bytes once decompressed", limit)
	}
	return out, nil
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
