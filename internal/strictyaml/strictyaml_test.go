package strictyaml

import (
	"errors"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

type inner struct {
	Name string `yaml:"name"`
	On   bool   `yaml:"on"`
}

type doc struct {
	Title  string            `yaml:"title"`
	Count  int               `yaml:"count"`
	Inner  *inner            `yaml:"inner"`
	List   []inner           `yaml:"list"`
	Labels map[string]string `yaml:"labels"`
	Skip   string            `yaml:"-"`
}

func TestDecodeErrors(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want []string // the error, one problem a line; nil for none
	}{
		{"valid", "title: t\ncount: 3\ninner: {name: n, on: true}\nlist:\n  - name: a\nlabels: {a/b: c, d: }\n", nil},
		{"empty", "", []string{"f.yaml: the document is empty"}},
		{"comment only", "# nothing\n", []string{"f.yaml: the document is empty"}},
		{"null", "~\n", []string{"f.yaml: the document is empty"}},
		{"not a mapping", "- a\n", []string{"f.yaml:1: expected a mapping at the top level, got a list"}},
		{"two documents", "title: a\n---\ntitle: b\n", []string{"f.yaml:2: more than one YAML document; expected one"}},
		{"parser error line counts from 1", "title: a\ninner: {name: x\ncount: 1\n", []string{"f.yaml:2: invalid YAML: did not find expected ',' or '}'"}},
		{"scanner error", "title: a\n\tcount: 1\n", []string{"f.yaml:2: invalid YAML: found a tab character that violates indentation"}},
		{"unknown field", "title: a\ninner:\n  nme: x\n", []string{"f.yaml:3: inner.nme: unknown field (known: name, on)"}},
		{"duplicate key", "title: a\ncount: 1\ntitle: b\n", []string{"f.yaml:3: title: set twice (first at line 1)"}},
		{"duplicate map key", "labels:\n  a: x\n  a: y\n", []string{`f.yaml:3: labels["a"]: set twice (first at line 2)`}},
		{"key not a name", "[a]: 1\n", []string{"f.yaml:1: keys must be plain names, got a list"}},
		{"wrong types", "title: [a]\ncount: many\ninner: x\nlist:\n  - on: yes please\nlabels: {a: [b]}\n", []string{
			"f.yaml:1: title: expected a string, got a list",
			`f.yaml:2: count: expected an integer, got the string "many"`,
			`f.yaml:3: inner: expected a mapping, got the string "x"`,
			`f.yaml:5: list[0].on: expected true or false, got the string "yes please"`,
			`f.yaml:6: labels["a"]: expected a string key and a string value`}},
		{"skipped field is unknown", "Skip: x\n", []string{"f.yaml:1: Skip: unknown field (known: count, inner, labels, list, title)"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := NewDoc("f.yaml")
			var out doc
			d.Decode([]byte(tt.in), &out)
			err := d.Err()
			if tt.want == nil {
				if err != nil {
					t.Fatalf("Decode: %v", err)
				}
				return
			}
			if err == nil || err.Error() != strings.Join(tt.want, "\n") {
				t.Fatalf("error:\n got: %v\nwant: %s", err, strings.Join(tt.want, "\n"))
			}
			var e *Error
			if !errors.As(err, &e) || e.File != "f.yaml" {
				t.Errorf("error is not an *Error for f.yaml: %#v", err)
			}
		})
	}
}

func TestDecodeValues(t *testing.T) {
	d := NewDoc("f.yaml")
	out := doc{Title: "default"}
	d.Decode([]byte("count: 0x10\ninner: {name: n, on: true}\nlist: [{name: a}, {name: b}]\nlabels: {a/b: c, d: }\ntitle:\n"), &out)
	if err := d.Err(); err != nil {
		t.Fatal(err)
	}
	if out.Title != "default" || out.Count != 16 || out.Inner == nil || *out.Inner != (inner{"n", true}) ||
		len(out.List) != 2 || out.List[1].Name != "b" || out.Labels["a/b"] != "c" || out.Labels["d"] != "" {
		t.Errorf("decoded %+v", out)
	}
	for field, line := range map[string]int{"inner.name": 2, "list[1]": 3, "list[1].name": 3, "labels[\"d\"]": 4, "list[7].name": 3, "missing": 0} {
		if got := d.lineOf(field); got != line {
			t.Errorf("LineOf(%q) = %d, want %d", field, got, line)
		}
	}
}

func TestFailfAndOrder(t *testing.T) {
	d := NewDoc("f.yaml")
	var out doc
	d.Decode([]byte("title: a\ncount: 2\n"), &out)
	d.Failf("count", "too many")
	d.Failf("title", "too short")
	d.Failf("inner.name", "is required")
	want := "f.yaml:2: count: too many\nf.yaml:1: title: too short\nf.yaml: inner.name: is required"
	if err := d.Err(); err == nil || err.Error() != want {
		t.Errorf("Err:\n got: %v\nwant: %s", err, want)
	}
	want = "f.yaml: inner.name: is required\nf.yaml:1: title: too short\nf.yaml:2: count: too many"
	if err := d.ErrByLine(); err == nil || err.Error() != want {
		t.Errorf("ErrByLine:\n got: %v\nwant: %s", err, want)
	}
}

func TestFieldsRequireString(t *testing.T) {
	d := NewDoc("f.yaml")
	root := d.Parse([]byte("a: x\nb: 12\nc: {}\n"))
	var got []string
	seen, ok := d.Fields(root, "", []string{"a", "b", "c", "d"}, func(key, field string, v *yaml.Node) {
		if s, ok := d.String(v, field); ok {
			got = append(got, s)
		}
	})
	if !ok || len(seen) != 3 {
		t.Fatalf("Fields: ok %v, seen %v", ok, seen)
	}
	d.Require(root, "", seen, "a", "d")
	want := "f.yaml:2: b: expected a string, got the integer 12\nf.yaml:3: c: expected a string, got a mapping\nf.yaml:1: d: required"
	if err := d.Err(); err == nil || err.Error() != want || len(got) != 1 || got[0] != "x" {
		t.Errorf("got %q, error:\n%v\nwant:\n%s", got, err, want)
	}
}

func TestDescribe(t *testing.T) {
	tests := map[string]string{
		"~":             "nothing (null)",
		"12":            "the integer 12",
		"1.5":           "the number 1.5",
		"true":          "the boolean true",
		"x":             `the string "x"`,
		"[a]":           "a list",
		"{a: b}":        "a mapping",
		"!!binary aGk=": `!!binary "aGk="`,
	}
	for in, want := range tests {
		var n yaml.Node
		if err := yaml.Unmarshal([]byte(in), &n); err != nil {
			t.Fatal(err)
		}
		if got := Describe(n.Content[0]); got != want {
			t.Errorf("Describe(%s) = %q, want %q", in, got, want)
		}
	}
}
