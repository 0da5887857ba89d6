package render

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"text/template"

	"gopkg.in/yaml.v3"
)

// funcs are the functions templates may call besides text/template's built-ins.
//
//	quote v         v as a double-quoted string, valid in YAML, JSON and TOML basic strings
//	join sep list   the elements of a list joined by sep: {{.Node.Etcd.Servers | join ","}}
//	indent n s      s with every non-empty line indented by n spaces
//	default d v     v, or d when v is empty (its type's zero value, or an empty list/map)
//	toYAML v        v as YAML without the final newline: {{toYAML .X | indent 4}}
//	required msg v  v, or an error "msg" when v is empty
//	hostPort h p    "h:p", or "[h]:p" when h is an IPv6 address
func funcs() template.FuncMap {
	return template.FuncMap{
		"quote":    quote,
		"join":     join,
		"indent":   indent,
		"default":  dflt,
		"toYAML":   toYAML,
		"required": required,
		"hostPort": func(host string, port any) string { return hostPort(host, fmt.Sprint(port)) },
	}
}

func quote(v any) (string, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(fmt.Sprint(v)); err != nil {
		return "", err
	}
	return strings.TrimSuffix(buf.String(), "\n"), nil
}

func join(sep string, list any) (string, error) {
	v := reflect.ValueOf(list)
	if v.Kind() != reflect.Slice && v.Kind() != reflect.Array {
		return "", fmt.Errorf("join: %T is not a list", list)
	}
	parts := make([]string, v.Len())
	for i := range parts {
		parts[i] = fmt.Sprint(v.Index(i).Interface())
	}
	return strings.Join(parts, sep), nil
}

func indent(n int, s string) string {
	pad := strings.Repeat(" ", n)
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		if l != "" {
			lines[i] = pad + l
		}
	}
	return strings.Join(lines, "\n")
}

func empty(v any) bool {
	if v == nil {
		return true
	}
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Slice, reflect.Map, reflect.Array, reflect.String:
		return rv.Len() == 0
	}
	return rv.IsZero()
}

func dflt(d, v any) any {
	if empty(v) {
		return d
	}
	return v
}

func required(msg string, v any) (any, error) {
	if empty(v) {
		return nil, fmt.Errorf("%s", msg)
	}
	return v, nil
}

func toYAML(v any) (string, error) {
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(v); err != nil {
		return "", fmt.Errorf("toYAML: %w", err)
	}
	if err := enc.Close(); err != nil {
		return "", fmt.Errorf("toYAML: %w", err)
	}
	return strings.TrimSuffix(buf.String(), "\n"), nil
}
