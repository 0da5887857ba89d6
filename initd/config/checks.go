package config

import (
	"errors"
	"fmt"
	"net/url"
	"path"
	"regexp"
	"strings"

	"github.com/coreos/ignition/v2/config/v3_6/types"
	"golang.org/x/crypto/ssh"
)

// The checks below cover what the schema walk in Validate cannot: values kiln can honour.
// Ignition's own validation (run by Parse) already checked paths are absolute and
// simplified, modes are in range, unit contents parse, and keyed lists have no duplicates.

// checkFile checks a storage.files entry.
func checkFile(field string, f types.File) []error {
	errs := checkNode(field, f.Node)
	src := f.Contents.Source
	if src == nil || *src == "" {
		return errs
	}
	u, err := url.Parse(*src)
	if err != nil {
		return append(errs, &FieldError{Path: field + ".contents.source", Err: err})
	}
	switch u.Scheme {
	case "data":
	case "http", "https":
		if h := f.Contents.Verification.Hash; h == nil || *h == "" {
			errs = append(errs, &FieldError{Path: field + ".contents.verification.hash",
				Err: fmt.Errorf("required for a %s source: kiln verifies every downloaded byte (give sha256-<hex> or sha512-<hex> of the decompressed contents)", u.Scheme)})
		}
		if u.Host == "" {
			errs = append(errs, &FieldError{Path: field + ".contents.source", Err: fmt.Errorf("%s URL %q has no host", u.Scheme, *src)})
		}
	default:
		errs = append(errs, &FieldError{Path: field + ".contents.source",
			Err: unsupported(fmt.Sprintf("scheme %q is not supported by kiln yet (data:, http: and https: are)", u.Scheme))})
	}
	if c := f.Contents.Compression; c != nil && *c != "" && *c != "gzip" {
		errs = append(errs, &FieldError{Path: field + ".contents.compression",
			Err: unsupported(fmt.Sprintf("compression %q is not supported (gzip is)", *c))})
	}
	return errs
}

// checkNode checks what files, directories and links share: the path and the owner.
func checkNode(field string, n types.Node) []error {
	var errs []error
	if path.Clean("/"+n.Path) == "/" {
		errs = append(errs, &FieldError{Path: field + ".path", Err: errors.New("cannot be the root directory")})
	}
	errs = append(errs, checkOwner(field+".user", n.User.ID, n.User.Name, "user")...)
	errs = append(errs, checkOwner(field+".group", n.Group.ID, n.Group.Name, "group")...)
	return errs
}

func checkOwner(field string, id *int, name *string, kind string) []error {
	hasName := name != nil && *name != ""
	switch {
	case id != nil && hasName:
		return []error{&FieldError{Path: field, Err: fmt.Errorf("set id or name, not both")}}
	case id != nil && *id < 0:
		return []error{&FieldError{Path: field + ".id", Err: fmt.Errorf("%s id %d is negative", kind, *id)}}
	case hasName && !validAccountName(*name):
		return []error{&FieldError{Path: field + ".name", Err: fmt.Errorf("%q is not a valid %s name", *name, kind)}}
	}
	return nil
}

// checkLink checks a storage.links entry.
func checkLink(field string, l types.Link) []error {
	errs := checkNode(field, l.Node)
	if l.Target == nil || *l.Target == "" {
		return append(errs, &FieldError{Path: field + ".target", Err: errors.New("is required")})
	}
	if l.Hard != nil && *l.Hard {
		if !path.IsAbs(*l.Target) {
			errs = append(errs, &FieldError{Path: field + ".target", Err: fmt.Errorf("hard link target %q must be an absolute path", *l.Target)})
		}
		if l.User.ID != nil || l.User.Name != nil || l.Group.ID != nil || l.Group.Name != nil {
			errs = append(errs, &FieldError{Path: field, Err: errors.New("a hard link has no owner of its own (it shares its target's); remove user and group")})
		}
	}
	return errs
}

// checkUnit checks a systemd.units entry.
func checkUnit(field string, u types.Unit) []error {
	var errs []error
	if err := checkUnitName(u.Name); err != nil {
		errs = append(errs, &FieldError{Path: field + ".name", Err: err})
	}
	if u.Mask != nil && *u.Mask {
		switch {
		case u.Enabled != nil && *u.Enabled:
			errs = append(errs, &FieldError{Path: field, Err: errors.New("mask and enabled: true contradict each other")})
		case u.Contents != nil:
			errs = append(errs, &FieldError{Path: field + ".contents", Err: errors.New("a masked unit's contents would never be used; remove contents or mask")})
		case len(u.Dropins) > 0:
			errs = append(errs, &FieldError{Path: field + ".dropins", Err: errors.New("a masked unit's drop-ins would never be used; remove dropins or mask")})
		}
	}
	for j, d := range u.Dropins {
		df := fmt.Sprintf("%s.dropins[%d]", field, j)
		if d.Name == "" || strings.ContainsAny(d.Name, "/\x00") || d.Name == ".conf" {
			errs = append(errs, &FieldError{Path: df + ".name", Err: fmt.Errorf("drop-in name %q must be a plain file name ending in .conf", d.Name)})
		}
		if d.Contents == nil {
			errs = append(errs, &FieldError{Path: df + ".contents", Err: errors.New("is required (kiln writes drop-ins; it does not remove them)")})
		}
	}
	return errs
}

func checkUnitName(name string) error {
	switch {
	case name == "":
		return errors.New("is required")
	case strings.ContainsAny(name, "/\x00"):
		return fmt.Errorf("unit name %q contains a slash", name)
	case strings.HasPrefix(name, "."):
		return fmt.Errorf("unit name %q starts with a dot", name)
	case strings.HasPrefix(name, "-"):
		return fmt.Errorf("unit name %q starts with a dash, which systemctl would read as an option", name)
	}
	return nil
}

// checkUser checks a passwd.users entry.
func checkUser(field string, u types.PasswdUser) []error {
	var errs []error
	add := func(sub string, err error) {
		errs = append(errs, &FieldError{Path: field + sub, Err: err})
	}
	if !validAccountName(u.Name) {
		add(".name", fmt.Errorf("%q is not a valid user name (lower-case letters, digits, _ and -, starting with a letter or _, at most 32)", u.Name))
	}
	if u.UID != nil && *u.UID < 0 {
		add(".uid", fmt.Errorf("uid %d is negative", *u.UID))
	}
	if u.HomeDir != nil && (!path.IsAbs(*u.HomeDir) || path.Clean(*u.HomeDir) == "/") {
		add(".homeDir", fmt.Errorf("home directory %q must be an absolute path below /", *u.HomeDir))
	}
	if u.Shell != nil && !path.IsAbs(*u.Shell) {
		add(".shell", fmt.Errorf("shell %q must be an absolute path", *u.Shell))
	}
	if u.PrimaryGroup != nil && !validAccountName(*u.PrimaryGroup) {
		add(".primaryGroup", fmt.Errorf("%q is not a valid group name", *u.PrimaryGroup))
	}
	for j, g := range u.Groups {
		if !validAccountName(string(g)) {
			add(fmt.Sprintf(".groups[%d]", j), fmt.Errorf("%q is not a valid group name", g))
		}
	}
	if u.Gecos != nil && strings.ContainsAny(*u.Gecos, ":\n") {
		add(".gecos", errors.New("must not contain ':' or a newline"))
	}
	if h := u.PasswordHash; h != nil {
		if err := checkPasswordHash(*h); err != nil {
			add(".passwordHash", err)
		}
	}
	for j, k := range u.SSHAuthorizedKeys {
		if _, _, _, _, err := ssh.ParseAuthorizedKey([]byte(k)); err != nil {
			add(fmt.Sprintf(".sshAuthorizedKeys[%d]", j), fmt.Errorf("not an SSH public key in authorized_keys format: %w", err))
		} else if strings.ContainsAny(string(k), "\n\r") {
			add(fmt.Sprintf(".sshAuthorizedKeys[%d]", j), errors.New("holds more than one line; give one key per entry"))
		}
	}
	return errs
}

// checkPasswordHash accepts crypt(3) hashes ("$id$…") and the locked markers "!" and
// "*" (optionally followed by a hash). An empty hash would allow logging in without a
// password; a plain password would end up readable in the config.
func checkPasswordHash(h string) error {
	switch {
	case h == "":
		return errors.New("an empty hash allows logging in without a password; kiln refuses it (use \"!\" to lock the password)")
	case strings.ContainsAny(h, ":\n"):
		return errors.New("must not contain ':' or a newline")
	case h == "!" || h == "*" || h == "!*":
		return nil
	}
	h = strings.TrimPrefix(h, "!")
	if !strings.HasPrefix(h, "$") || strings.Count(h, "$") < 3 {
		return errors.New("is not a crypt(3) hash such as $y$… or $6$… (make one with mkpasswd); a plain-text password does not belong here")
	}
	return nil
}

// checkGroup checks a passwd.groups entry.
func checkGroup(field string, g types.PasswdGroup) []error {
	var errs []error
	if !validAccountName(g.Name) {
		errs = append(errs, &FieldError{Path: field + ".name", Err: fmt.Errorf("%q is not a valid group name", g.Name)})
	}
	if g.Gid != nil && *g.Gid < 0 {
		errs = append(errs, &FieldError{Path: field + ".gid", Err: fmt.Errorf("gid %d is negative", *g.Gid)})
	}
	return errs
}

// accountName is what Debian's useradd and groupadd accept by default (NAME_REGEX in
// adduser.conf, and the shadow tools' check): a lower-case letter or _, then
// lower-case letters, digits, _ and -, optionally ending in $ (machine accounts).
var accountName = regexp.MustCompile(`^[a-z_][a-z0-9_-]{0,30}[a-z0-9_$-]?$`)

func validAccountName(name string) bool {
	return accountName.MatchString(name)
}
