// Package strictyaml decodes YAML documents strictly: a file holds exactly one document,
// unknown fields and keys given twice are errors, strings are not guessed from numbers or
// booleans, and every error names the file, the line and the field.
//
// A Doc collects every problem of one document rather than stopping at the first, so a user
// fixes them all in one go. Decode fills a struct through its yaml tags; Fields lets a caller
// walk a mapping by hand when each field needs its own checks.
package strictyaml

import (
	"errors"
	"fmt"
	"io"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// Error is one problem with a YAML document. It reads "file:line: field: problem"; the line
// is left out when it is not known (0) and the field when the problem is with the whole
// document.
type Error struct {
	File  string // as given to NewDoc, e.g. "/etc/kiln/node.yaml"
	Line  int    // 1-based; 0 when the field is absent from the document
	Field string // a path such as "etcd.members[2]" or `labels["a/b"]`; "" for the document
	Err   error
}

func (e *Error) Error() string {
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

func (e *Error) Unwrap() error { return e.Err }

// Doc decodes one document and collects its problems. It remembers the line of every field it
// decoded, so that checks made after decoding can point at the value they refuse.
type Doc struct {
	file  string
	lines map[string]int
	errs  []*Error
}

// NewDoc returns a Doc whose errors start with file.
func NewDoc(file string) *Doc {
	return &Doc{file: file, lines: map[string]int{}}
}

// File is the name errors start with.
func (d *Doc) File() string { return d.file }

// Fail records err at line for field.
func (d *Doc) Fail(line int, field string, err error) {
	d.errs = append(d.errs, &Error{File: d.file, Line: line, Field: field, Err: err})
}

// FailAt records a problem with the value n of field.
func (d *Doc) FailAt(n *yaml.Node, field, format string, a ...any) {
	d.Fail(n.Line, field, fmt.Errorf(format, a...))
}

// Failf records a problem found after decoding, at the line where field (or its nearest
// parent present in the document) was written.
func (d *Doc) Failf(field, format string, a ...any) {
	d.Fail(d.lineOf(field), field, fmt.Errorf(format, a...))
}

// lineOf returns the line of field, or of its nearest parent the document has; 0 if none.
func (d *Doc) lineOf(field string) int {
	for f := field; f != ""; f = parentField(f) {
		if l, ok := d.lines[f]; ok {
			return l
		}
	}
	return 0
}

// Failed is the number of problems recorded so far.
func (d *Doc) Failed() int { return len(d.errs) }

// Err returns the problems recorded, each an *Error, in the order they were found, joined; nil
// if there are none.
func (d *Doc) Err() error {
	errs := make([]error, len(d.errs))
	for i, e := range d.errs {
		errs[i] = e
	}
	return errors.Join(errs...)
}

// ErrByLine is Err with the problems ordered by line (problems without a line first), for
// documents checked in passes after decoding.
func (d *Doc) ErrByLine() error {
	sort.SliceStable(d.errs, func(i, j int) bool { return d.errs[i].Line < d.errs[j].Line })
	return d.Err()
}

// Parse reads data, which must hold exactly one YAML document whose top level is a mapping,
// and returns that mapping. On a problem it records it and returns nil.
func (d *Doc) Parse(data []byte) *yaml.Node {
	dec := yaml.NewDecoder(strings.NewReader(string(data)))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			d.Fail(0, "", errEmpty)
		} else {
			d.syntaxError(err)
		}
		return nil
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		d.Fail(extra.Line, "", errors.New("more than one YAML document; expected one"))
		return nil
	} else if !errors.Is(err, io.EOF) {
		d.syntaxError(err)
		return nil
	}
	n := &doc
	if n.Kind == yaml.DocumentNode {
		if len(n.Content) == 0 {
			d.Fail(0, "", errEmpty)
			return nil
		}
		n = n.Content[0]
	}
	n = Deref(n)
	if isNull(n) {
		d.Fail(0, "", errEmpty)
		return nil
	}
	if n.Kind != yaml.MappingNode {
		d.FailAt(n, "", "expected a mapping at the top level, got %s", Describe(n))
		return nil
	}
	return n
}

var errEmpty = errors.New("the document is empty")

var yamlLineErr = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// parserProblems are the messages of yaml.v3's parser (as opposed to its scanner);
// yaml.v3 v3.0.1 reports their line counting from 0.
var parserProblems = []string{
	"did not find expected <stream-start>", "did not find expected <document start>",
	"found undefined tag handle", "did not find expected node content",
	"did not find expected '-' indicator", "did not find expected key",
	"did not find expected ',' or ']'", "did not find expected ',' or '}'",
	"found duplicate %YAML directive", "found incompatible YAML document",
	"found duplicate %TAG directive",
}

// syntaxError records a yaml.v3 parse error at its line, counted from 1.
func (d *Doc) syntaxError(err error) {
	msg := err.Error()
	if m := yamlLineErr.FindStringSubmatch(msg); m != nil {
		line, _ := strconv.Atoi(m[1])
		for _, p := range parserProblems {
			if m[2] == p {
				line++
			}
		}
		d.Fail(line, "", errors.New("invalid YAML: "+m[2]))
		return
	}
	d.Fail(0, "", errors.New("invalid YAML: "+strings.TrimPrefix(msg, "yaml: ")))
}

// Describe names what a node holds, for "expected X, got Y" messages.
func Describe(n *yaml.Node) string {
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

// Join names field key of the mapping at path: "disk" and "size" give "disk.size".
func Join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// Index names entry i of the list at path: "formats[2]".
func Index(path string, i int) string { return fmt.Sprintf("%s[%d]", path, i) }

// MapKey names an entry of a free-form mapping: kubernetes.nodeLabels["example.com/role"].
func MapKey(path, key string) string { return fmt.Sprintf("%s[%q]", path, key) }

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

// Deref follows aliases to the node they name.
func Deref(n *yaml.Node) *yaml.Node {
	for n != nil && n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	return n
}

// IsNull reports whether n is an empty value (null, ~ or nothing).
func IsNull(n *yaml.Node) bool { return isNull(Deref(n)) }

func isNull(n *yaml.Node) bool { return n.Kind == yaml.ScalarNode && n.Tag == "!!null" }
