package spec

import (
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/kilnproject/kiln/initd/config"
	"github.com/kilnproject/kiln/internal/strictyaml"
)

// Profile is a role profile, profiles/<role>.yaml: what a node of that
// role carries on top of the image definition.
type Profile struct {
	// File is the absolute path of the profile.
	File string
	// Role equals the file name without .yaml.
	Role      string
	Artifacts []Artifact
	Units     Units
	// Overlays are absolute directories (<dir of File>/../overlays/<name>),
	// copied after the definition's overlays.
	Overlays []string
	// Templates is an absolute directory, or empty (carried, not checked).
	Templates string
	// Kubernetes is nil when the profile has no kubernetes section.
	Kubernetes *Kubernetes
	// Images are pre-pulled into the image, in the order given.
	Images []Image
}

// Artifact is one file fetched into the image: a URL or a local file,
// pinned by sha256 here or in the lock file, placed at Dest or extracted.
type Artifact struct {
	Name string
	// Source is the url or path as written; the lock and the image
	// metadata record it. URL or Path (absolute, variables expanded) is set.
	Source string
	URL    string
	Path   string
	// SHA256 is 64 lower-case hex digits, or empty: then the lock pins it.
	SHA256 string
	// ChecksumURL is the publisher's checksum file for it (a digest alone, or sha256sum's
	// lines), when it is not beside the file as <url>.sha256 or <url>.sha256sum; kiln lock
	// checks the download against it.
	ChecksumURL string
	// Dest is the absolute path in the image of a plain file (Extract nil).
	Dest string
	// Mode of a plain file; default 0644.
	Mode fs.FileMode
	// Extract, if set, unpacks the artifact instead of copying it.
	Extract *Extract
	Pos     Pos
}

// Extract says how to unpack an archive artifact.
type Extract struct {
	// Format is one of ArchiveFormats; guessed from the source name when
	// not given.
	Format string
	// Files maps archive member paths (relative, "./" removed) to absolute
	// paths in the image; only those members are extracted.
	Files map[string]string
	// Dir (the artifact's dest) receives the whole archive when Files is
	// empty, after removing Strip leading path components from each member.
	Dir   string
	Strip int
}

// Units lists systemd units to enable, disable or mask in the image.
type Units struct {
	Enable, Disable, Mask []string
}

// ArchiveFormats are the formats Extract accepts.
var ArchiveFormats = []string{"tar", "tar.gz", "tar.xz", "tar.zst", "tar.bz2", "deb"}

var (
	hexRE      = regexp.MustCompile(`^[0-9a-f]{64}$`)
	artNameRE  = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]*$`)
	unitRE     = regexp.MustCompile(`^[A-Za-z0-9:_.@\\-]+\.(service|socket|timer|target|mount|automount|path|slice|swap)$`)
	modeRE     = regexp.MustCompile(`^0?[0-7]{3,4}$`)
	formatExts = map[string]string{".tar": "tar", ".tar.gz": "tar.gz", ".tgz": "tar.gz", ".tar.xz": "tar.xz", ".txz": "tar.xz", ".tar.zst": "tar.zst", ".tar.bz2": "tar.bz2", ".deb": "deb"}
)

// profileFile returns the path of role's profile in dir.
func profileFile(dir, role string) string { return filepath.Join(dir, role+".yaml") }

// loadRoleProfile reads and validates the profile for role in dir, its overlays named under
// dir's sibling overlays/.
func loadRoleProfile(dir, role string) (*Profile, error) {
	return loadRoleProfileIn(dir, filepath.Join(dir, "..", "overlays"), role)
}

// loadRoleProfileIn reads and validates the profile for role in dir, its overlays named under
// overlaysDir.
func loadRoleProfileIn(dir, overlaysDir, role string) (*Profile, error) {
	if !nameRE.MatchString(role) {
		return nil, fmt.Errorf("role %q: use lower-case letters, digits and '-'", role)
	}
	file := profileFile(dir, role)
	if _, err := os.Stat(file); errors.Is(err, fs.ErrNotExist) {
		msg := fmt.Sprintf("profile for role %q: %s does not exist", role, file)
		if roles, _ := profileRoles(dir); len(roles) > 0 {
			msg += " (roles: " + strings.Join(roles, ", ") + ")"
		}
		return nil, errors.New(msg)
	}
	return loadProfile(file, overlaysDir, role)
}

// OverlaysDir is where the definition's overlays, and its profiles', are found: overlays/
// beside the definition's directory (images/).
func (def *Definition) OverlaysDir() string {
	return filepath.Join(filepath.Dir(def.File), "..", "overlays")
}

// Profile loads the profile for role from the definition's profiles
// directory; a missing file is reported at the definition's profiles line.
func (def *Definition) Profile(role string) (*Profile, error) {
	p, err := loadRoleProfileIn(def.ProfilesDir, def.OverlaysDir(), role)
	if err != nil && nameRE.MatchString(role) {
		if _, serr := os.Stat(profileFile(def.ProfilesDir, role)); errors.Is(serr, fs.ErrNotExist) {
			return nil, Errorf(def.ProfilesPos, "profiles", "%v", err)
		}
	}
	return p, err
}

// profileRoles lists the roles that have a profile in dir, sorted.
func profileRoles(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var roles []string
	for _, e := range ents {
		if r, ok := strings.CutSuffix(e.Name(), ".yaml"); ok && !e.IsDir() && nameRE.MatchString(r) {
			roles = append(roles, r)
		}
	}
	sort.Strings(roles)
	return roles, nil
}

// Profiles loads every profile of the definition's profiles directory, sorted by role.
func (def *Definition) Profiles() ([]*Profile, error) {
	return loadProfiles(def.ProfilesDir, def.OverlaysDir())
}

// LoadProfiles loads every profile in dir, sorted by role, their overlays named under dir's
// sibling overlays/.
func LoadProfiles(dir string) ([]*Profile, error) {
	return loadProfiles(dir, filepath.Join(dir, "..", "overlays"))
}

func loadProfiles(dir, overlaysDir string) ([]*Profile, error) {
	roles, err := profileRoles(dir)
	if err != nil {
		return nil, fmt.Errorf("profiles: %w", err)
	}
	var out []*Profile
	var errs []error
	for _, r := range roles {
		p, err := loadRoleProfileIn(dir, overlaysDir, r)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, p)
	}
	return out, errors.Join(errs...)
}

func loadProfile(file, overlaysDir, role string) (*Profile, error) {
	d, root, abs, err := parse(file, "profile")
	if err != nil {
		return nil, err
	}
	dir := filepath.Dir(abs)
	p := &Profile{File: abs}
	var imagesNode, kubernetesNode, templatesNode *yaml.Node
	seen, _ := d.Fields(root, "", []string{"role", "artifacts", "units", "overlays", "templates", "kubernetes", "images"}, func(key, field string, v *yaml.Node) {
		switch key {
		case "role":
			if s, ok := d.String(v, field); ok {
				if s != role {
					d.FailAt(v, field, "%q does not match the file name (%s.yaml)", s, role)
				}
				p.Role = s
			}
		case "artifacts":
			p.Artifacts = d.artifacts(v, field, dir)
		case "units":
			d.units(v, field, &p.Units)
		case "overlays":
			p.Overlays = d.overlays(v, field, overlaysDir)
		case "kubernetes":
			kubernetesNode = v
			p.Kubernetes = d.kubernetes(v, field)
		case "images":
			imagesNode = v
			p.Images = d.images(v, field)
		case "templates":
			templatesNode = v
			if s, ok := d.String(v, field); ok {
				t, err := expandPath(s, dir)
				if err != nil {
					d.FailAt(v, field, "%v", err)
				}
				p.Templates = t
			}
		}
	})
	d.Require(root, "", seen, "role")
	if len(p.Images) > 0 && !seen["kubernetes"] {
		d.FailAt(imagesNode, "images", "pre-pulled images need a kubernetes section (its runtime imports them)")
	}
	d.plainRole(p.Role, kubernetesNode, templatesNode)
	if err := d.Err(); err != nil {
		return nil, err
	}
	return p, nil
}

// plainRole refuses a kubernetes section and templates (the nodes given, nil when absent)
// in the profile of a role that is not one of Kubernetes': kiln-init configures Kubernetes,
// and renders templates, for config.Roles only; an image of another role is a plain node.
func (d *decoder) plainRole(role string, kubernetes, templates *yaml.Node) {
	if role == "" || config.Role(role).Known() {
		return
	}
	var known []string
	for _, r := range config.Roles() {
		known = append(known, string(r))
	}
	roles := strings.Join(known, ", ")
	if kubernetes != nil {
		d.FailAt(kubernetes, "kubernetes", "role %q is a plain node, without Kubernetes: kiln-init configures Kubernetes for the roles %s only", role, roles)
	}
	if templates != nil {
		d.FailAt(templates, "templates", "role %q is a plain node, without Kubernetes: kiln-init renders templates for the roles %s only", role, roles)
	}
}

func (d *decoder) artifacts(n *yaml.Node, at, dir string) []Artifact {
	var out []Artifact
	names := map[string]bool{}
	d.list(n, at, func(item *yaml.Node, f string) {
		a := d.artifact(item, f, dir)
		if a.Name != "" {
			if names[a.Name] {
				d.FailAt(item, f+".name", "%q used by an earlier artifact", a.Name)
			}
			names[a.Name] = true
		}
		out = append(out, a)
	})
	return out
}

// artifactNodes are the values of an artifact's fields that are checked against each other
// once all are read.
type artifactNodes struct{ extract, mode, dest *yaml.Node }

func (d *decoder) artifact(n *yaml.Node, at, dir string) Artifact {
	a := Artifact{Pos: d.pos(n)}
	var nodes artifactNodes
	seen, ok := d.Fields(n, at, []string{"name", "url", "path", "sha256", "checksum", "dest", "mode", "extract"}, func(key, field string, v *yaml.Node) {
		switch key {
		case "extract":
			nodes.extract = v
		case "checksum":
			if s, ok := d.String(v, field); ok {
				if u, err := url.Parse(s); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
					d.FailAt(v, field, "%q is not an http(s) URL of the publisher's checksum file", s)
				} else {
					a.ChecksumURL = s
				}
			}
		case "sha256":
			d.artifactSHA256(v, field, &a)
		case "mode":
			nodes.mode = v
			d.artifactMode(v, field, &a)
		default:
			s, ok := d.String(v, field)
			if !ok {
				return
			}
			if key == "dest" {
				nodes.dest = v
			}
			d.artifactString(key, field, s, v, dir, &a)
		}
	})
	if !ok {
		return a
	}
	d.Require(n, at, seen, "name")
	if !seen["url"] && !seen["path"] {
		d.FailAt(n, at, "one of url or path is required")
	}
	if nodes.extract == nil {
		if !seen["dest"] {
			d.FailAt(n, strictyaml.Join(at, "dest"), "required (or extract)")
		}
		if a.Mode == 0 && nodes.mode == nil {
			a.Mode = 0o644
		}
		return a
	}
	d.artifactExtract(at, nodes, &a)
	return a
}

// artifactSHA256 reads the text whatever YAML thinks it is: a hex digest may happen to look
// like a number.
func (d *decoder) artifactSHA256(v *yaml.Node, field string, a *Artifact) {
	if v.Kind != yaml.ScalarNode || v.Tag == "!!null" {
		d.FailAt(v, field, "expected a sha256 (64 hex digits), got %s", strictyaml.Describe(v))
		return
	}
	if s := strings.TrimPrefix(v.Value, "sha256:"); hexRE.MatchString(s) {
		a.SHA256 = s
	} else {
		d.FailAt(v, field, "%q is not a sha256 (64 lower-case hex digits)", v.Value)
	}
}

func (d *decoder) artifactMode(v *yaml.Node, field string, a *Artifact) {
	if v.Kind != yaml.ScalarNode || (v.Tag != "!!str" && v.Tag != "!!int") || !modeRE.MatchString(v.Value) {
		d.FailAt(v, field, "expected an octal mode such as \"0755\", got %s", strictyaml.Describe(v))
		return
	}
	m, _ := strconv.ParseUint(v.Value, 8, 32)
	a.Mode = fs.FileMode(m)
}

// artifactString decodes the string fields of an artifact: name, url, path and dest.
func (d *decoder) artifactString(key, field, s string, v *yaml.Node, dir string, a *Artifact) {
	switch key {
	case "name":
		if !artNameRE.MatchString(s) {
			d.FailAt(v, field, "%q: use lower-case letters, digits, '.', '_' and '-'", s)
		}
		a.Name = s
	case "url", "path":
		if u, p, ok := d.source(key, field, s, a.Source, v, dir); ok {
			a.URL, a.Path, a.Source = u, p, s
		}
	case "dest":
		if err := imagePath(s); err != nil {
			d.FailAt(v, field, "%v", err)
			return
		}
		a.Dest = path.Clean(s)
	}
}

// artifactExtract decodes the extract section of a, which says where its files go instead of
// dest and mode.
func (d *decoder) artifactExtract(at string, nodes artifactNodes, a *Artifact) {
	if nodes.mode != nil {
		d.FailAt(nodes.mode, strictyaml.Join(at, "mode"), "only for plain files; extracted files keep the archive's modes")
	}
	a.Extract = d.extract(nodes.extract, strictyaml.Join(at, "extract"), a.Source)
	if a.Extract == nil {
		return
	}
	switch {
	case a.Extract.Files != nil && nodes.dest != nil:
		d.FailAt(nodes.dest, strictyaml.Join(at, "dest"), "not used with extract.files (each file names its destination)")
	case a.Extract.Files == nil && nodes.dest == nil:
		d.FailAt(nodes.extract, strictyaml.Join(at, "extract"), "needs files, or a dest directory on the artifact")
	default:
		a.Extract.Dir = a.Dest
	}
}

// source decodes an artifact's url or path (key says which) into the URL or the expanded
// path; have is the source read so far, since only one of them may be given.
func (d *decoder) source(key, field, s, have string, v *yaml.Node, dir string) (u, p string, ok bool) {
	if have != "" {
		d.FailAt(v, field, "give either url or path, not both")
		return "", "", false
	}
	if key == "url" {
		parsed, err := url.Parse(s)
		if err != nil || (parsed.Scheme != "http" && parsed.Scheme != "https") || parsed.Host == "" {
			d.FailAt(v, field, "%q is not an http(s) URL", s)
			return "", "", false
		}
		return s, "", true
	}
	p, err := expandPath(s, dir)
	if err != nil {
		d.FailAt(v, field, "%v", err)
		return "", "", false
	}
	return "", p, true
}

func (d *decoder) extract(n *yaml.Node, at, source string) *Extract {
	x := &Extract{}
	_, ok := d.Fields(n, at, []string{"format", "files", "strip"}, func(key, field string, v *yaml.Node) {
		switch key {
		case "format":
			if s, ok := d.String(v, field); ok {
				if !contains(ArchiveFormats, s) {
					d.FailAt(v, field, "%q is not an archive format (one of: %s)", s, strings.Join(ArchiveFormats, ", "))
				}
				x.Format = s
			}
		case "strip":
			if v.Kind != yaml.ScalarNode || v.Tag != "!!int" {
				d.FailAt(v, field, "expected a number, got %s", strictyaml.Describe(v))
				return
			}
			s, err := strconv.Atoi(v.Value)
			if err != nil || s < 0 || s > 32 {
				d.FailAt(v, field, "%s: want 0 to 32", v.Value)
				return
			}
			x.Strip = s
		case "files":
			x.Files = d.files(v, field)
		}
	})
	if !ok {
		return nil
	}
	if x.Format == "" {
		x.Format = guessFormat(source)
		if x.Format == "" {
			d.FailAt(n, strictyaml.Join(at, "format"), "required: cannot tell the format from %q (one of: %s)", source, strings.Join(ArchiveFormats, ", "))
		}
	}
	return x
}

// files decodes extract.files: archive member -> absolute path in the image.
func (d *decoder) files(n *yaml.Node, at string) map[string]string {
	if n.Kind != yaml.MappingNode {
		d.FailAt(n, at, "expected a mapping of archive member to destination, got %s", strictyaml.Describe(n))
		return map[string]string{}
	}
	out := map[string]string{}
	dests := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := strictyaml.Deref(n.Content[i]), strictyaml.Deref(n.Content[i+1])
		member, ok := d.String(k, at)
		if !ok {
			continue
		}
		field := at + "." + member
		m := strings.TrimPrefix(member, "./")
		switch {
		case m == "" || strings.HasPrefix(m, "/") || containsDotDot(m):
			d.FailAt(k, field, "%q: want a relative path inside the archive", member)
			continue
		case out[path.Clean(m)] != "":
			d.FailAt(k, field, "given more than once")
			continue
		}
		dest, ok := d.String(v, field)
		if !ok {
			continue
		}
		if err := imagePath(dest); err != nil {
			d.FailAt(v, field, "%v", err)
			continue
		}
		dest = path.Clean(dest)
		if dests[dest] {
			d.FailAt(v, field, "%s is the destination of another member", dest)
		}
		dests[dest] = true
		out[path.Clean(m)] = dest
	}
	if len(n.Content) == 0 {
		d.FailAt(n, at, "lists no files")
	}
	return out
}

// guessFormat infers an archive format from a file name or URL.
func guessFormat(source string) string {
	if u, err := url.Parse(source); err == nil && u.Scheme != "" {
		source = u.Path
	}
	for ext, f := range formatExts {
		if strings.HasSuffix(source, ext) && (f != "tar" || !strings.Contains(path.Base(source), ".tar.")) {
			return f
		}
	}
	return ""
}

// imagePath checks an absolute, clean path inside the image.
func imagePath(s string) error {
	switch {
	case !strings.HasPrefix(s, "/"):
		return fmt.Errorf("%q: want an absolute path in the image", s)
	case s == "/" || path.Clean(s) == "/":
		return fmt.Errorf("%q: cannot replace /", s)
	case containsDotDot(s):
		return fmt.Errorf("%q: must not contain ..", s)
	}
	return nil
}

func containsDotDot(s string) bool {
	for _, part := range strings.Split(s, "/") {
		if part == ".." {
			return true
		}
	}
	return false
}

func (d *decoder) units(n *yaml.Node, at string, u *Units) {
	where := map[string]string{}
	d.Fields(n, at, []string{"enable", "disable", "mask"}, func(key, field string, v *yaml.Node) {
		list := d.strs(v, field, func(s, f string, n *yaml.Node) {
			if !unitRE.MatchString(s) {
				d.FailAt(n, f, "%q is not a systemd unit name (like kubelet.service)", s)
				return
			}
			if other, ok := where[s]; ok {
				d.FailAt(n, f, "%q is also in units.%s", s, other)
			}
			where[s] = key
		})
		switch key {
		case "enable":
			u.Enable = list
		case "disable":
			u.Disable = list
		case "mask":
			u.Mask = list
		}
	})
}
