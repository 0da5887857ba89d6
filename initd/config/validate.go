package config

import (
	"errors"
	"fmt"
	"net/url"
	"path"
	"reflect"
	"strings"

	"github.com/coreos/ignition/v2/config/v3_5/types"
)

// ErrUnsupported marks a part of a config that kiln does not apply yet.
var ErrUnsupported = errors.New("not supported by kiln yet")

// FieldError is a problem with one field of a config, named by its JSON path
// (e.g. "storage.files[0].contents.source").
type FieldError struct {
	Path string
	Err  error
}

func (e *FieldError) Error() string {
	if e.Err == ErrUnsupported {
		return e.Path + " is " + ErrUnsupported.Error()
	}
	return e.Path + ": " + e.Err.Error()
}

func (e *FieldError) Unwrap() error { return e.Err }

// supported lists the fields kiln applies, as JSON paths with "[]" for any list index.
// Everything else that is set in a config is refused by Validate. Grow this list as
// kiln learns to apply more (and never before).
var supported = []string{
	"ignition.version",
	"storage.files[].path",
	"storage.files[].overwrite",
	"storage.files[].mode",
	"storage.files[].user.id",
	"storage.files[].user.name",
	"storage.files[].group.id",
	"storage.files[].group.name",
	"storage.files[].contents.source",
	"storage.files[].contents.compression",
	"storage.files[].contents.verification.hash",
}

// Validate refuses everything in the config that kiln does not apply yet. The error
// lists every such field by JSON path, e.g. "storage.disks is not supported by kiln yet";
// errors.As finds the *FieldError values.
func (c *Config) Validate() error {
	var errs []error
	walk(reflect.ValueOf(c.Ignition), "", "", &errs)
	for i, f := range c.Ignition.Storage.Files {
		errs = append(errs, checkFile(fmt.Sprintf("storage.files[%d]", i), f)...)
	}
	return errors.Join(errs...)
}

// walk reports every set field of v (at JSON path p, normalized path norm) that is not
// supported. A field is set when it is non-zero; empty lists count as unset.
func walk(v reflect.Value, p, norm string, errs *[]error) {
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		if !v.IsNil() {
			walk(v.Elem(), p, norm, errs)
		}
		return
	case reflect.Struct:
		t := v.Type()
		for i := range t.NumField() {
			sf, fv := t.Field(i), v.Field(i)
			if !sf.IsExported() {
				continue
			}
			if sf.Anonymous {
				walk(fv, p, norm, errs)
				continue
			}
			name, _, _ := strings.Cut(sf.Tag.Get("json"), ",")
			if name == "" || name == "-" {
				name = sf.Name
			}
			visit(fv, join(p, name), join(norm, name), errs)
		}
		return
	case reflect.Slice, reflect.Array:
		for i := range v.Len() {
			visit(v.Index(i), fmt.Sprintf("%s[%d]", p, i), norm+"[]", errs)
		}
		return
	}
}

// visit checks one field: leave it if unset, accept it if supported, look inside it if
// it is an object, refuse it otherwise (a list or a value).
func visit(v reflect.Value, p, norm string, errs *[]error) {
	if isUnset(v) {
		return
	}
	within := false
	for _, s := range supported {
		if s == norm {
			return
		}
		if strings.HasPrefix(s, norm+".") || strings.HasPrefix(s, norm+"[") {
			within = true
		}
	}
	if !within && !isStruct(v) {
		*errs = append(*errs, &FieldError{Path: p, Err: ErrUnsupported})
		return
	}
	// Look inside: supported children pass, unsupported ones are named as precisely
	// as possible (passwd.users rather than passwd).
	walk(v, p, norm, errs)
}

func isStruct(v reflect.Value) bool {
	for v.Kind() == reflect.Pointer || v.Kind() == reflect.Interface {
		if v.IsNil() {
			return false
		}
		v = v.Elem()
	}
	return v.Kind() == reflect.Struct
}

func isUnset(v reflect.Value) bool {
	switch v.Kind() {
	case reflect.Slice, reflect.Map:
		return v.Len() == 0
	}
	return v.IsZero()
}

func join(p, name string) string {
	if p == "" {
		return name
	}
	return p + "." + name
}

// checkFile checks what the schema walk cannot: the values kiln can honour.
func checkFile(field string, f types.File) []error {
	var errs []error
	if path.Clean(f.Path) == "/" {
		errs = append(errs, &FieldError{Path: field + ".path", Err: errors.New("a file cannot be written at /")})
	}
	if src := f.Contents.Source; src != nil && *src != "" {
		u, err := url.Parse(*src)
		switch {
		case err != nil:
			errs = append(errs, &FieldError{Path: field + ".contents.source", Err: err})
		case u.Scheme != "data":
			errs = append(errs, &FieldError{Path: field + ".contents.source",
				Err: fmt.Errorf("scheme %q is %w (only data: URLs are)", u.Scheme, ErrUnsupported)})
		}
	}
	if !isRoot(f.User.ID, f.User.Name) {
		errs = append(errs, &FieldError{Path: field + ".user",
			Err: fmt.Errorf("owners other than root are %w", ErrUnsupported)})
	}
	if !isRoot(f.Group.ID, f.Group.Name) {
		errs = append(errs, &FieldError{Path: field + ".group",
			Err: fmt.Errorf("groups other than root are %w", ErrUnsupported)})
	}
	return errs
}

func isRoot(id *int, name *string) bool {
	return (id == nil || *id == 0) && (name == nil || *name == "" || *name == "root")
}
