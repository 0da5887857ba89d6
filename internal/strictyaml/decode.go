package strictyaml

import (
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// Decode parses data (one YAML document holding a mapping) into out, a pointer to a struct
// whose fields carry yaml tags. Fields may be structs, pointers to them, slices,
// map[string]string, string, bool and int. A null value leaves the field as it was. Problems
// are recorded in d.
func (d *Doc) Decode(data []byte, out any) {
	n := d.Parse(data)
	if n == nil {
		return
	}
	d.value(n, reflect.ValueOf(out).Elem(), "")
}

// value decodes n into v at field path p.
func (d *Doc) value(n *yaml.Node, v reflect.Value, p string) {
	n = Deref(n)
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
		d.list(n, v, p)
	case reflect.String:
		if n.Kind != yaml.ScalarNode {
			d.FailAt(n, p, "expected a string, got %s", Describe(n))
			return
		}
		v.SetString(n.Value)
	case reflect.Bool:
		var b bool
		if n.Kind != yaml.ScalarNode || n.Tag != "!!bool" || n.Decode(&b) != nil {
			d.FailAt(n, p, "expected true or false, got %s", Describe(n))
			return
		}
		v.SetBool(b)
	case reflect.Int:
		i, err := strconv.ParseInt(n.Value, 0, 32)
		if n.Kind != yaml.ScalarNode || n.Tag != "!!int" || err != nil {
			d.FailAt(n, p, "expected an integer, got %s", Describe(n))
			return
		}
		v.SetInt(i)
	default:
		panic(fmt.Sprintf("strictyaml: Decode cannot decode into %s", v.Type()))
	}
}

func (d *Doc) list(n *yaml.Node, v reflect.Value, p string) {
	if n.Kind != yaml.SequenceNode {
		d.FailAt(n, p, "expected a list, got %s", Describe(n))
		return
	}
	s := reflect.MakeSlice(v.Type(), len(n.Content), len(n.Content))
	for i, item := range n.Content {
		ip := Index(p, i)
		d.lines[ip] = item.Line
		d.value(item, s.Index(i), ip)
	}
	v.Set(s)
}

// object decodes a mapping into a struct; keys are matched to yaml tags exactly.
func (d *Doc) object(n *yaml.Node, v reflect.Value, p string) {
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
	d.Fields(n, p, names, func(key, field string, val *yaml.Node) {
		d.value(val, v.Field(fields[key]), field)
	})
}

// stringMap decodes a mapping of scalars into a map[string]string.
func (d *Doc) stringMap(n *yaml.Node, v reflect.Value, p string) {
	if n.Kind != yaml.MappingNode {
		d.FailAt(n, p, "expected a mapping, got %s", Describe(n))
		return
	}
	m := reflect.MakeMapWithSize(v.Type(), len(n.Content)/2)
	first := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], Deref(n.Content[i+1])
		fp := MapKey(p, k.Value)
		if line, dup := first[k.Value]; dup {
			d.FailAt(k, fp, "set twice (first at line %d)", line)
			continue
		}
		first[k.Value] = k.Line
		d.lines[fp] = k.Line
		if k.Kind != yaml.ScalarNode || val.Kind != yaml.ScalarNode {
			d.Fail(k.Line, fp, errors.New("expected a string key and a string value"))
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
