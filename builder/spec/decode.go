package spec

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	"gopkg.in/yaml.v3"
)

// decoder walks a yaml.Node tree and collects problems as *Error values.
type decoder struct {
	file string
	errs []error
}

// parse reads path and returns its single top-level mapping node.
func parse(path string) (*decoder, *yaml.Node, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	d := &decoder{file: path}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, nil, &Error{Pos: Pos{File: path}, Msg: "document is empty"}
		}
		return nil, nil, syntaxError(path, err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		return nil, nil, &Error{Pos: Pos{File: path, Line: extra.Line}, Msg: "more than one YAML document; expected one"}
	} else if !errors.Is(err, io.EOF) {
		return nil, nil, syntaxError(path, err)
	}
	root := &doc
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = root.Content[0]
	}
	if root.Kind != yaml.MappingNode {
		return nil, nil, &Error{Pos: Pos{File: path, Line: root.Line}, Msg: "expected a mapping at the top level, got " + describe(root)}
	}
	return d, root, nil
}

func (d *decoder) err() error { return errors.Join(d.errs...) }

func (d *decoder) pos(n *yaml.Node) Pos { return Pos{File: d.file, Line: n.Line} }

func (d *decoder) failf(n *yaml.Node, field, format string, a ...any) {
	d.errs = append(d.errs, Errorf(d.pos(n), field, format, a...))
}

// describe names what a node holds, for "expected X, got Y" messages.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		switch n.Tag {
		case "!!null":
			return "nothing (null)"
		case "!!int":
			return "the integer " + n.Value
		case "!!float":
			return "the number " + n.Value
		case "!!bool":
			return "the boolean " + n.Value
		case "!!str":
			return fmt.Sprintf("the string %q", n.Value)
		}
		return fmt.Sprintf("%s %q", n.Tag, n.Value)
	}
	return "an unexpected YAML node"
}

func join(parent, key string) string {
	if parent == "" {
		return key
	}
	return parent + "." + key
}

func deref(n *yaml.Node) *yaml.Node {
	for n != nil && n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	return n
}

// fields visits the keys of mapping n (at field path) in document order,
// refusing keys not in known, duplicate keys and non-mappings. It reports
// whether n was a mapping; seen holds the keys present.
func (d *decoder) fields(n *yaml.Node, path string, known []string, visit func(key, field string, v *yaml.Node)) (seen map[string]bool, ok bool) {
	n = deref(n)
	if n.Kind != yaml.MappingNode {
		d.failf(n, path, "expected a mapping, got %s", describe(n))
		return nil, false
	}
	seen = map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := deref(n.Content[i]), deref(n.Content[i+1])
		key := k.Value
		field := join(path, key)
		switch {
		case k.Kind != yaml.ScalarNode:
			d.failf(k, path, "keys must be plain names, got %s", describe(k))
		case seen[key]:
			d.failf(k, field, "given more than once")
		case !contains(known, key):
			d.failf(k, field, "unknown field (known: %s)", strings.Join(sorted(known), ", "))
		default:
			seen[key] = true
			visit(key, field, v)
		}
	}
	return seen, true
}

func (d *decoder) require(n *yaml.Node, path string, seen map[string]bool, keys ...string) {
	for _, k := range keys {
		if !seen[k] {
			d.failf(n, join(path, k), "required")
		}
	}
}

// str decodes a string scalar. Integers, booleans and nulls are refused so
// that `version: 1.10` or `tag: 12` are noticed rather than mangled.
func (d *decoder) str(n *yaml.Node, field string) (string, bool) {
	if n.Kind != yaml.ScalarNode || n.Tag != "!!str" {
		d.failf(n, field, "expected a string, got %s", describe(n))
		return "", false
	}
	return n.Value, true
}

// strs decodes a list of strings and calls check, if not nil, on each one
// with its field path and node. Entries given twice are refused.
func (d *decoder) strs(n *yaml.Node, field string, check func(s, field string, n *yaml.Node)) []string {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil
	}
	if n.Kind != yaml.SequenceNode {
		d.failf(n, field, "expected a list, got %s", describe(n))
		return nil
	}
	out := make([]string, 0, len(n.Content))
	seen := map[string]bool{}
	for i, item := range n.Content {
		item = deref(item)
		f := fmt.Sprintf("%s[%d]", field, i)
		if item.Kind == yaml.ScalarNode && item.Tag != "!!str" && n.Style&yaml.FlowStyle != 0 {
			d.failf(item, f, "expected a string, got %s (in a [a, b] list a comma separates entries: quote entries that contain one)", describe(item))
			continue
		}
		s, ok := d.str(item, f)
		switch {
		case !ok:
		case seen[s]:
			d.failf(item, f, "%q listed twice", s)
		default:
			seen[s] = true
			if check != nil {
				check(s, f, item)
			}
			out = append(out, s)
		}
	}
	return out
}

// size decodes a size: an integer number of bytes or a string such as 4GiB.
func (d *decoder) size(n *yaml.Node, field string) (Size, bool) {
	if n.Kind != yaml.ScalarNode || (n.Tag != "!!str" && n.Tag != "!!int") {
		d.failf(n, field, "expected a size such as 4GiB, got %s", describe(n))
		return 0, false
	}
	s, err := ParseSize(n.Value)
	if err != nil {
		d.failf(n, field, "%v", err)
		return 0, false
	}
	return s, true
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func sorted(list []string) []string {
	out := append([]string(nil), list...)
	sort.Strings(out)
	return out
}
