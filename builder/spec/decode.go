package spec

import (
	"fmt"
	"os"

	"gopkg.in/yaml.v3"

	"github.com/kilnproject/kiln/internal/strictyaml"
)

// decoder walks a yaml.Node tree and collects problems as *Error values.
type decoder struct {
	*strictyaml.Doc
}

// parse reads path and returns its single top-level mapping node.
func parse(path string) (*decoder, *yaml.Node, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	d := &decoder{strictyaml.NewDoc(path)}
	root := d.Parse(data)
	if root == nil {
		return nil, nil, d.Err()
	}
	return d, root, nil
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
	s, err := ParseSize(n.Value)
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
