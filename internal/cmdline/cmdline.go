// Package cmdline parses the kernel command line. It is the one reading of /proc/cmdline
// that stage 1, the config sources and the node facts share.
//
// The line is split like the kernel's own parser splits it: white space (space, tab, \n,
// \r, \v, \f) separates parameters unless it stands inside double quotes, and the quotes
// themselves are dropped, so both key="a b" and "key=a b" give the parameter key with the
// value "a b". A parameter is key=value, split at its first '=' (the value may hold more);
// a parameter without '=' is a flag with no value. A lone "--" ends the kernel's
// parameters: what follows is init's, and Lookup and Values do not search it.
//
// A key may appear more than once. Lookup returns the last occurrence, as the kernel does
// for its own parameters; Values and Params list every occurrence in order.
package cmdline

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// ProcPath is where the running kernel's command line is read from.
const ProcPath = "/proc/cmdline"

// Param is one kernel parameter.
type Param struct {
	Key   string
	Value string
	// HasValue tells "key=" (true, empty Value) from a bare "key" (false).
	HasValue bool
}

// String gives the parameter as key=value, or key alone for a flag (without the quotes
// the line may have had).
func (p Param) String() string {
	if !p.HasValue {
		return p.Key
	}
	return p.Key + "=" + p.Value
}

// Line is a parsed kernel command line.
type Line struct {
	// Raw is the line as given, without leading and trailing white space.
	Raw string
	// Params are the kernel's parameters in order, up to a lone "--".
	Params []Param
	// Init holds the words after "--", which the kernel passes to init.
	Init []string
}

// Parse splits a kernel command line into parameters.
func Parse(s string) Line {
	l := Line{Raw: strings.TrimSpace(s)}
	words := split(s)
	for i, w := range words {
		if w == "--" {
			l.Init = words[i+1:]
			break
		}
		k, v, ok := strings.Cut(w, "=")
		l.Params = append(l.Params, Param{Key: k, Value: v, HasValue: ok})
	}
	return l
}

// Read parses the command line stored in file; "" means ProcPath.
func Read(file string) (Line, error) {
	if file == "" {
		file = ProcPath
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return Line{}, fmt.Errorf("read kernel command line: %w", err)
	}
	return Parse(string(data)), nil
}

// Lookup returns the value of the last parameter named key, and whether there is one.
// A bare flag ("quiet") is found with an empty value.
func (l Line) Lookup(key string) (string, bool) {
	for i := len(l.Params) - 1; i >= 0; i-- {
		if l.Params[i].Key == key {
			return l.Params[i].Value, true
		}
	}
	return "", false
}

// Values returns the value of every parameter named key, in order.
func (l Line) Values(key string) []string {
	var out []string
	for _, p := range l.Params {
		if p.Key == key {
			out = append(out, p.Value)
		}
	}
	return out
}

// Duration parses a timeout given on the command line: whole seconds ("90") or a Go
// duration ("90s", "1m30s"). Negative values are errors.
func Duration(v string) (time.Duration, error) {
	if n, err := strconv.ParseUint(v, 10, 32); err == nil {
		return time.Duration(n) * time.Second, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, errors.New("not a duration (e.g. 90s, 5m) or a number of seconds")
	}
	if d < 0 {
		return 0, errors.New("must not be negative")
	}
	return d, nil
}

// split cuts s at white space outside double quotes and drops the quotes.
func split(s string) []string {
	var words []string
	var cur strings.Builder
	inQuote, inWord := false, false
	for _, r := range s {
		switch {
		case r == '"':
			inQuote = !inQuote
			inWord = true
		case !inQuote && isSpace(r):
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words
}

// isSpace is the kernel's isspace for the characters a command line can hold.
func isSpace(r rune) bool {
	switch r {
	case ' ', '\t', '\n', '\r', '\v', '\f':
		return true
	}
	return false
}
