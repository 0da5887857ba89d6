package config

import (
	"errors"
	"fmt"
	"io"
	"reflect"
	"sort"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// This file decodes a YAML document into a typed struct by walking yaml.Node, so that
// every error can name its line and field path and unknown fields are errors.

// NodeError is a problem with one field of a YAML document such as node.yaml.
type NodeError struct {
	File  string // as given to ParseNode, e.g. "/etc/kiln/node.yaml"
	Line  int    // 1-based; 0 when the field is absent from the document
	Field string // e.g. "etcd.members[2]"; "" for the whole document
	Err   error
}

func (e *NodeError) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		fmt.Fprintf(&b, ":%d", e.Line)
	}
	if e.Field != "" {
		b.WriteString(": " + e.Field)
	}
	b.WriteString(": " + e.Err.Error())
	return b.String()
}

func (e *NodeError) Unwrap() error { return e.Err }

// yamlDoc decodes one document and remembers the line of every field it saw.
type yamlDoc struct {
	file  string
	lines map[string]int
	errs  []*NodeError
}

func (d *yamlDoc) fail(line int, field string, err error) {
	d.errs = append(d.errs, &NodeError{File: d.file, Line: line, Field: field, Err: err})
}

// failf reports a problem found after decoding, at the line where field (or its nearest
// parent present in the document) was written.
func (d *yamlDoc) failf(field, format string, args ...any) {
	d.fail(d.lineOf(field), field, fmt.Errorf(format, args...))
}

func (d *yamlDoc) lineOf(field string) int {
	for f := field; f != ""; f = parentField(f) {
		if l, ok := d.lines[f]; ok {
			return l
		}
	}
	return 0
}

func parentField(f string) string {
	if strings.HasSuffix(f, "]") {
		if i := strings.LastIndexByte(f, '['); i >= 0 {
			return f[:i]
		}
	}
	if i := strings.LastIndexByte(f, '.'); i >= 0 {
		return f[:i]
	}
	return ""
}

// err returns the collected errors, ordered by line, joined.
func (d *yamlDoc) err() error {
	if len(d.errs) == 0 {
		return nil
	}
	sort.SliceStable(d.errs, func(i, j int) bool { return d.errs[i].Line < d.errs[j].Line })
	errs := make([]error, len(d.errs))
	for i, e := range d.errs {
		errs[i] = e
	}
	return errors.Join(errs...)
}

// decodeYAML parses data (exactly one YAML document holding a mapping) into out, a
// pointer to a struct whose fields carry yaml tags.
func decodeYAML(d *yamlDoc, data []byte, out any) {
	var root yaml.Node
	dec := yaml.NewDecoder(strings.NewReader(string(data)))
	if err := dec.Decode(&root); err != nil {
		if errors.Is(err, io.EOF) {
			d.fail(0, "", errors.New("the document is empty"))
			return
		}
		line, msg := yamlErrorLine(err)
		d.fail(line, "", fmt.Errorf("not valid YAML: %s", msg))
		return
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		d.fail(extra.Line, "", errors.New("holds more than one YAML document"))
		return
	}
	n := &root
	if n.Kind == yaml.DocumentNode {
		if len(n.Content) == 0 {
			d.fail(0, "", errors.New("the document is empty"))
			return
		}
		n = n.Content[0]
	}
	if isNull(n) {
		d.fail(n.Line, "", errors.New("the document is empty"))
		return
	}
	d.value(n, reflect.ValueOf(out).Elem(), "")
}

// yamlErrorLine picks "line N" out of a yaml.v3 error message.
func yamlErrorLine(err error) (int, string) {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	if rest, ok := strings.CutPrefix(msg, "line "); ok {
		num, tail, ok := strings.Cut(rest, ":")
		if n, err := strconv.Atoi(num); ok && err == nil {
			return n, strings.TrimSpace(tail)
		}
	}
	return 0, msg
}

func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.Tag == "!!null"
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		switch n.Tag {
		case "!!int", "!!float":
			return "the number " + n.Value
		case "!!bool":
			return "the boolean " + n.Value
		}
		return strconv.Quote(n.Value)
	}
	return "something else"
}

// value decodes n into v at field path p.
func (d *yamlDoc) value(n *yaml.Node, v reflect.Value, p string) {
	if n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	if isNull(n) {
		return // an empty value leaves the default
	}
	switch v.Kind() {
	case reflect.Pointer:
		if v.IsNil() {
			v.Set(reflect.New(v.Type().Elem()))
		}
		d.value(n, v.Elem(), p)
	case reflect.Struct:
		d.object(n, v, p)
	case reflect.Map:
		d.stringMap(n, v, p)
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			d.fail(n.Line, p, fmt.Errorf("want a list, got %s", kindName(n)))
			return
		}
		s := reflect.MakeSlice(v.Type(), len(n.Content), len(n.Content))
		for i, item := range n.Content {
			ip := fmt.Sprintf("%s[%d]", p, i)
			d.lines[ip] = item.Line
			d.value(item, s.Index(i), ip)
		}
		v.Set(s)
	case reflect.String:
		if n.Kind != yaml.ScalarNode {
			d.fail(n.Line, p, fmt.Errorf("want a string, got %s", kindName(n)))
			return
		}
		v.SetString(n.Value)
	case reflect.Bool:
		var b bool
		if n.Kind != yaml.ScalarNode || n.Tag != "!!bool" || n.Decode(&b) != nil {
			d.fail(n.Line, p, fmt.Errorf("want true or false, got %s", kindName(n)))
			return
		}
		v.SetBool(b)
	case reflect.Int:
		i, err := strconv.ParseInt(n.Value, 0, 32)
		if n.Kind != yaml.ScalarNode || n.Tag != "!!int" || err != nil {
			d.fail(n.Line, p, fmt.Errorf("want an integer, got %s", kindName(n)))
			return
		}
		v.SetInt(i)
	default:
		panic(fmt.Sprintf("config: decodeYAML cannot decode into %s", v.Type()))
	}
}

// object decodes a mapping into a struct; keys are matched to yaml tags exactly.
func (d *yamlDoc) object(n *yaml.Node, v reflect.Value, p string) {
	if n.Kind != yaml.MappingNode {
		d.fail(n.Line, p, fmt.Errorf("want a mapping, got %s", kindName(n)))
		return
	}
	t := v.Type()
	fields := map[string]int{}
	var names []string
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
		if name == "" || name == "-" {
			continue
		}
		fields[name] = i
		names = append(names, name)
	}
	seen := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], n.Content[i+1]
		fp := joinField(p, k.Value)
		if first, dup := seen[k.Value]; dup {
			d.fail(k.Line, fp, fmt.Errorf("set twice (first at line %d)", first))
			continue
		}
		seen[k.Value] = k.Line
		idx, ok := fields[k.Value]
		if !ok || k.Kind != yaml.ScalarNode {
			d.fail(k.Line, fp, fmt.Errorf("unknown field (known fields here: %s)", strings.Join(names, ", ")))
			continue
		}
		d.lines[fp] = k.Line
		d.value(val, v.Field(idx), fp)
	}
}

// stringMap decodes a mapping of scalars into a map[string]string.
func (d *yamlDoc) stringMap(n *yaml.Node, v reflect.Value, p string) {
	if n.Kind != yaml.MappingNode {
		d.fail(n.Line, p, fmt.Errorf("want a mapping, got %s", kindName(n)))
		return
	}
	m := reflect.MakeMapWithSize(v.Type(), len(n.Content)/2)
	seen := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], n.Content[i+1]
		if val.Kind == yaml.AliasNode {
			val = val.Alias
		}
		fp := mapField(p, k.Value)
		if first, dup := seen[k.Value]; dup {
			d.fail(k.Line, fp, fmt.Errorf("set twice (first at line %d)", first))
			continue
		}
		seen[k.Value] = k.Line
		d.lines[fp] = k.Line
		if k.Kind != yaml.ScalarNode || val.Kind != yaml.ScalarNode {
			d.fail(k.Line, fp, errors.New("want a string key and a string value"))
			continue
		}
		value := val.Value
		if isNull(val) {
			value = ""
		}
		m.SetMapIndex(reflect.ValueOf(k.Value), reflect.ValueOf(value))
	}
	v.Set(m)
}

func joinField(p, name string) string {
	if p == "" {
		return name
	}
	return p + "." + name
}

// mapField names a map entry: kubernetes.nodeLabels["example.com/role"].
func mapField(p, key string) string {
	return fmt.Sprintf("%s[%q]", p, key)
}
