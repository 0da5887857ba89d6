package strictyaml

import (
	"slices"
	"strings"

	"gopkg.in/yaml.v3"
)

// Fields visits the keys of mapping n (the value of field path) in document order. It
// refuses a value that is not a mapping, keys that are not plain names, keys given twice and
// keys not in known, and visits the rest. It reports whether n was a mapping; seen holds the
// keys visited.
func (d *Doc) Fields(n *yaml.Node, path string, known []string, visit func(key, field string, v *yaml.Node)) (seen map[string]bool, ok bool) {
	n = Deref(n)
	if n.Kind != yaml.MappingNode {
		d.FailAt(n, path, "expected a mapping, got %s", Describe(n))
		return nil, false
	}
	seen = map[string]bool{}
	first := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := Deref(n.Content[i]), Deref(n.Content[i+1])
		key := k.Value
		field := Join(path, key)
		if k.Kind != yaml.ScalarNode {
			d.FailAt(k, path, "keys must be plain names, got %s", Describe(k))
			continue
		}
		if line, dup := first[key]; dup {
			d.FailAt(k, field, "set twice (first at line %d)", line)
			continue
		}
		first[key] = k.Line
		if !slices.Contains(known, key) {
			d.FailAt(k, field, "unknown field (known: %s)", strings.Join(sorted(known), ", "))
			continue
		}
		seen[key] = true
		d.lines[field] = k.Line
		visit(key, field, v)
	}
	return seen, true
}

// Require records "required" for each of keys that seen lacks; n is the mapping they belong
// in, at path.
func (d *Doc) Require(n *yaml.Node, path string, seen map[string]bool, keys ...string) {
	for _, k := range keys {
		if !seen[k] {
			d.FailAt(n, Join(path, k), "required")
		}
	}
}

// String decodes a string scalar. Integers, booleans and nulls are refused so that
// `version: 1.10` or `tag: 12` are noticed rather than mangled.
func (d *Doc) String(n *yaml.Node, field string) (string, bool) {
	n = Deref(n)
	if n.Kind != yaml.ScalarNode || n.Tag != "!!str" {
		d.FailAt(n, field, "expected a string, got %s", Describe(n))
		return "", false
	}
	return n.Value, true
}

func sorted(list []string) []string {
	out := slices.Clone(list)
	slices.Sort(out)
	return out
}
