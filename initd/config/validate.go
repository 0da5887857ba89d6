package config

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
)

// errUnsupported marks a part of a config that kiln does not apply yet.
var errUnsupported = errors.New("not supported by kiln yet")

// FieldError is a problem with one field of a config, named by its JSON path
// (e.g. "storage.files[0].contents.source").
type FieldError struct {
	Path string
	Err  error
}

func (e *FieldError) Error() string {
	if e.Err == errUnsupported {
		return e.Path + " is " + errUnsupported.Error()
	}
	return e.Path + ": " + e.Err.Error()
}

func (e *FieldError) Unwrap() error { return e.Err }

// supported lists the fields kiln applies, as JSON paths with "[]" for any list index.
// Everything else that is set in a config is refused by Validate. Grow this list as
// kiln learns to apply more (and never before).
var supported = []string{
	"ignition.version",
	"ignition.config.merge[].source",
	"ignition.config.merge[].compression",
	"ignition.config.merge[].verification.hash",
	"ignition.config.replace.source",
	"ignition.config.replace.compression",
	"ignition.config.replace.verification.hash",

	"kernelArguments.shouldExist",
	"kernelArguments.shouldNotExist",

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

	"storage.directories[].path",
	"storage.directories[].overwrite",
	"storage.directories[].mode",
	"storage.directories[].user.id",
	"storage.directories[].user.name",
	"storage.directories[].group.id",
	"storage.directories[].group.name",

	"storage.links[].path",
	"storage.links[].overwrite",
	"storage.links[].target",
	"storage.links[].hard",
	"storage.links[].user.id",
	"storage.links[].user.name",
	"storage.links[].group.id",
	"storage.links[].group.name",

	"systemd.units[].name",
	"systemd.units[].contents",
	"systemd.units[].enabled",
	"systemd.units[].mask",
	"systemd.units[].dropins[].name",
	"systemd.units[].dropins[].contents",

	"passwd.users[].name",
	"passwd.users[].uid",
	"passwd.users[].gecos",
	"passwd.users[].homeDir",
	"passwd.users[].shell",
	"passwd.users[].primaryGroup",
	"passwd.users[].groups",
	"passwd.users[].passwordHash",
	"passwd.users[].sshAuthorizedKeys",
	"passwd.users[].system",
	"passwd.users[].noCreateHome",
	"passwd.users[].noUserGroup",

	"storage.disks[].device",
	"storage.disks[].wipeTable",
	"storage.disks[].partitions[].number",
	"storage.disks[].partitions[].label",
	"storage.disks[].partitions[].sizeMiB",
	"storage.disks[].partitions[].startMiB",
	"storage.disks[].partitions[].typeGuid",
	"storage.disks[].partitions[].guid",
	"storage.disks[].partitions[].wipePartitionEntry",
	"storage.disks[].partitions[].shouldExist",

	"storage.raid[].name",
	"storage.raid[].level",
	"storage.raid[].devices",
	"storage.raid[].spares",
	"storage.raid[].options",

	"storage.luks[].name",
	"storage.luks[].device",
	"storage.luks[].keyFile.source",
	"storage.luks[].keyFile.verification.hash",
	"storage.luks[].label",
	"storage.luks[].uuid",
	"storage.luks[].options",
	"storage.luks[].wipeVolume",
	"storage.luks[].discard",
	"storage.luks[].openOptions",

	"storage.filesystems[].device",
	"storage.filesystems[].format",
	"storage.filesystems[].wipeFilesystem",
	"storage.filesystems[].label",
	"storage.filesystems[].uuid",
	"storage.filesystems[].options",
	"storage.filesystems[].mountOptions",
	"storage.filesystems[].path",

	"passwd.groups[].name",
	"passwd.groups[].gid",
	"passwd.groups[].system",
}

// refused are fields kiln deliberately does not apply, with the reason given instead of
// the generic "not supported".
var refused = map[string]string{
	"storage.disks[].partitions[].resize": "resize is not supported: kiln never changes the size of an existing partition",
	"storage.luks[].clevis":               "clevis (tang, tpm2) is not supported: give a keyFile",
	"storage.luks[].cex":                  "cex (IBM Crypto Express keys) is not supported: give a keyFile",
}

// unsupported is an errUnsupported with a specific message.
type unsupported string

func (u unsupported) Error() string        { return string(u) }
func (u unsupported) Is(target error) bool { return target == errUnsupported }

// Validate refuses everything in the config that kiln does not apply, and values kiln
// cannot honour. The error lists every problem by JSON path, e.g.
// "storage.raid[0].level: level \"raid5\" is not supported (raid0, raid1, raid10 are, and their other names stripe, mirror, 0, 1 and 10)" or
// "passwd.users[0].sshAuthorizedKeys[1]: not an SSH public key: …"; errors.As finds
// the *FieldError values and errors.Is(err, errUnsupported) tells unsupported features
// from bad values.
func (c *Config) Validate() error {
	var errs []error
	walk(reflect.ValueOf(c.Ignition), "", "", &errs)
	ign := c.Ignition
	errs = append(errs, checkReference("ignition.config.replace", ign.Ignition.Config.Replace)...)
	for i, r := range ign.Ignition.Config.Merge {
		errs = append(errs, checkReference(fmt.Sprintf("ignition.config.merge[%d]", i), r)...)
	}
	errs = append(errs, checkKernelArgs(c.KernelArgs())...)
	for i, f := range ign.Storage.Files {
		errs = append(errs, checkFile(fmt.Sprintf("storage.files[%d]", i), f)...)
	}
	for i, d := range ign.Storage.Directories {
		errs = append(errs, checkNode(fmt.Sprintf("storage.directories[%d]", i), d.Node)...)
	}
	for i, l := range ign.Storage.Links {
		errs = append(errs, checkLink(fmt.Sprintf("storage.links[%d]", i), l)...)
	}
	for i, d := range ign.Storage.Disks {
		errs = append(errs, checkDisk(fmt.Sprintf("storage.disks[%d]", i), d)...)
	}
	for i, r := range ign.Storage.Raid {
		errs = append(errs, checkRaid(fmt.Sprintf("storage.raid[%d]", i), r)...)
	}
	for i, l := range ign.Storage.Luks {
		errs = append(errs, checkLuks(fmt.Sprintf("storage.luks[%d]", i), l)...)
	}
	for i, f := range ign.Storage.Filesystems {
		errs = append(errs, checkFilesystem(fmt.Sprintf("storage.filesystems[%d]", i), f)...)
	}
	for i, u := range ign.Systemd.Units {
		errs = append(errs, checkUnit(fmt.Sprintf("systemd.units[%d]", i), u)...)
	}
	for i, u := range ign.Passwd.Users {
		errs = append(errs, checkUser(fmt.Sprintf("passwd.users[%d]", i), u)...)
	}
	for i, g := range ign.Passwd.Groups {
		errs = append(errs, checkGroup(fmt.Sprintf("passwd.groups[%d]", i), g)...)
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
	if msg, ok := refused[norm]; ok {
		*errs = append(*errs, &FieldError{Path: p, Err: unsupported(msg)})
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
		*errs = append(*errs, &FieldError{Path: p, Err: errUnsupported})
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
