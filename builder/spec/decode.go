package spec

import (
	"fmt"
	"os"
	"path/filepath"

	"gopkg.in/yaml.v3"

	"github.com/kilnproject/kiln/internal/strictyaml"
)

// decoder walks a yaml.Node tree and collects problems as *Error values.
type decoder struct {
	*strictyaml.Doc
}

// parse reads the document at path, what kind of document it is, and returns its single
// top-level mapping node and its absolute path.
func parse(path, what string) (d *decoder, root *yaml.Node, abs string, err error) {
	abs, err = filepath.Abs(path)
	if err != nil {
		return nil, nil, "", fmt.Errorf("%s %s: %w", what, path, err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, "", fmt.Errorf("%s: %w", what, err)
	}
	d = &decoder{strictyaml.NewDoc(path)}
	if root = d.Parse(data); root == nil {
		return nil, nil, "", fmt.Errorf("%s: %w", what, d.Err())
	}
	return d, root, abs, nil
}

// list calls each for every entry of the list n (at field path at); null is an empty list.
func (d *decoder) list(n *yaml.Node, at string, each func(item *yaml.Node, at string)) {
	if strictyaml.IsNull(n) {
		return
	}
	if n.Kind != yaml.SequenceNode {
		d.FailAt(n, at, "expected a list, got %s", strictyaml.Describe(n))
		return
	}
	for i, item := range n.Content {
		each(strictyaml.Deref(item), strictyaml.Index(at, i))
	}
}

func (d *decoder) pos(n *yaml.Node) Pos { return Pos{File: d.File(), Line: n.Line} }

// strs decodes a list of strings and calls check, if not nil, on each one
// with its field path and node. Entries given twice are refused.
func (d *decoder) strs(n *yaml.Node, field string, check func(s, field string, n *yaml.Node)) []string {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil
	}
	if n.Kind != yaml.SequenceNode {
		d.FailAt(n, field, "expected a list, got %s", strictyaml.Describe(n))
		return nil
	}
	out := make([]string, 0, len(n.Content))
	seen := map[string]bool{}
	for i, item := range n.Content {
		item = strictyaml.Deref(item)
		f := fmt.Sprintf("%s[%d]", field, i)
		if item.Kind == yaml.ScalarNode && item.Tag != "!!str" && n.Style&yaml.FlowStyle != 0 {
			d.FailAt(item, f, "expected a string, got %s (in a [a, b] list a comma separates entries: quote entries that contain one)", strictyaml.Describe(item))
			continue
		}
		s, ok := d.String(item, f)
		switch {
		case !ok:
		case seen[s]:
			d.FailAt(item, f, "%q listed twice", s)
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
		d.FailAt(n, field, "expected a size such as 4GiB, got %s", strictyaml.Describe(n))
		return 0, false
	}
	s, err := parseSize(n.Value)
	if err != nil {
		d.FailAt(n, field, "%v", err)
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
