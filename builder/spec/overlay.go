package spec

import (
	"errors"
	"fmt"
	"path/filepath"

	"gopkg.in/yaml.v3"

	"github.com/kilnproject/kiln/internal/strictyaml"
)

// ProfileOverlay is a document given to `kiln bake --profile-overlay FILE`
// that replaces where a role's artifacts and images come from, by name,
// without editing the profile (a local mirror, a test build):
//
//	artifacts:
//	  - {name: kubelet, url: http://127.0.0.1:8080/kubelet, sha256: …}
//	images:
//	  - {name: registry.k8s.io/pause:3.10.2, source: 127.0.0.1:5000/pause:3.10.2, digest: sha256:…}
type ProfileOverlay struct {
	// File is the absolute path of the document.
	File      string
	Artifacts []ArtifactOverride
	Images    []ImageOverride
}

// ArtifactOverride replaces the source (URL or Path, with Source as
// written) and/or the SHA256 of the artifact called Name. Empty fields are
// kept from the profile.
type ArtifactOverride struct {
	Name           string
	Source         string
	URL, Path      string
	SHA256         string
	Pos            Pos
	sourceReplaced bool
}

// ImageOverride replaces the Source and/or Digest of the image called Name
// (its full name with tag). Empty fields are kept from the profile.
type ImageOverride struct {
	Name   string
	Source string
	Digest string
	Pos    Pos
}

// LoadProfileOverlay reads and validates a profile overlay document.
func LoadProfileOverlay(file string) (*ProfileOverlay, error) {
	d, root, abs, err := parse(file, "profile overlay")
	if err != nil {
		return nil, err
	}
	dir := filepath.Dir(abs)
	o := &ProfileOverlay{File: abs}
	d.Fields(root, "", []string{"artifacts", "images"}, func(key, field string, v *yaml.Node) {
		switch key {
		case "artifacts":
			d.list(v, field, func(item *yaml.Node, at string) {
				if a, ok := d.artifactOverride(item, at, dir); ok {
					for _, prev := range o.Artifacts {
						if prev.Name == a.Name {
							d.FailAt(item, at+".name", "%q given more than once", a.Name)
						}
					}
					o.Artifacts = append(o.Artifacts, a)
				}
			})
		case "images":
			d.list(v, field, func(item *yaml.Node, at string) {
				if im, ok := d.imageOverride(item, at); ok {
					for _, prev := range o.Images {
						if prev.Name == im.Name {
							d.FailAt(item, at+".name", "%q given more than once", im.Name)
						}
					}
					o.Images = append(o.Images, im)
				}
			})
		}
	})
	if err := d.Err(); err != nil {
		return nil, err
	}
	return o, nil
}

func (d *decoder) artifactOverride(n *yaml.Node, at, dir string) (ArtifactOverride, bool) {
	a := ArtifactOverride{Pos: d.pos(n)}
	before := d.Failed()
	seen, ok := d.Fields(n, at, []string{"name", "url", "path", "sha256"}, func(key, field string, v *yaml.Node) {
		if key == "sha256" {
			if v.Kind == yaml.ScalarNode && v.Tag != "!!null" && hexRE.MatchString(trimSHA(v.Value)) {
				a.SHA256 = trimSHA(v.Value)
			} else {
				d.FailAt(v, field, "%s is not a sha256 (64 lower-case hex digits)", strictyaml.Describe(v))
			}
			return
		}
		s, ok := d.String(v, field)
		if !ok {
			return
		}
		switch key {
		case "name":
			a.Name = s
		case "url", "path":
			if u, p, ok := d.source(key, field, s, a.Source, v, dir); ok {
				a.URL, a.Path, a.Source, a.sourceReplaced = u, p, s, true
			}
		}
	})
	if !ok {
		return a, false
	}
	d.Require(n, at, seen, "name")
	if !seen["url"] && !seen["path"] && !seen["sha256"] {
		d.FailAt(n, at, "nothing to replace: give url, path or sha256")
	}
	return a, d.Failed() == before
}

func (d *decoder) imageOverride(n *yaml.Node, at string) (ImageOverride, bool) {
	before := d.Failed()
	r, seen, ok := d.imageRef(n, at, false)
	im := ImageOverride{Name: r.name, Source: r.source, Digest: r.digest, Pos: d.pos(n)}
	if !ok {
		return im, false
	}
	if !seen["source"] && !seen["digest"] {
		d.FailAt(n, at, "nothing to replace: give source or digest")
	}
	return im, d.Failed() == before
}

func trimSHA(s string) string {
	if len(s) > 7 && s[:7] == "sha256:" {
		return s[7:]
	}
	return s
}

// Check reports, at its file:line, every entry of o that names no artifact
// or image in any of profiles (all the roles of the profiles directory):
// an overlay entry that replaces nothing is most likely a typo.
func (o *ProfileOverlay) Check(profiles []*Profile) error {
	arts, imgs := map[string]bool{}, map[string]bool{}
	for _, p := range profiles {
		for _, a := range p.Artifacts {
			arts[a.Name] = true
		}
		for _, im := range p.Images {
			imgs[im.Name] = true
		}
	}
	var errs []error
	for i, a := range o.Artifacts {
		if !arts[a.Name] {
			errs = append(errs, Errorf(a.Pos, fmt.Sprintf("artifacts[%d].name", i), "%q is not an artifact of any profile", a.Name))
		}
	}
	for i, im := range o.Images {
		if !imgs[im.Name] {
			errs = append(errs, Errorf(im.Pos, fmt.Sprintf("images[%d].name", i), "%q is not an image of any profile", im.Name))
		}
	}
	return errors.Join(errs...)
}

// Apply returns a copy of p with o's replacements made. Entries naming
// nothing in p are ignored (they may be meant for another role; see Check).
// A replaced source keeps the profile's sha256 or digest unless o gives
// one too, and drops the profile's checksum URL (it names the checksum of
// the file replaced; kiln lock looks beside the new one).
func (o *ProfileOverlay) Apply(p *Profile) *Profile {
	out := *p
	out.Artifacts = append([]Artifact(nil), p.Artifacts...)
	out.Images = append([]Image(nil), p.Images...)
	for _, ov := range o.Artifacts {
		for i := range out.Artifacts {
			a := &out.Artifacts[i]
			if a.Name != ov.Name {
				continue
			}
			if ov.sourceReplaced {
				a.Source, a.URL, a.Path, a.ChecksumURL = ov.Source, ov.URL, ov.Path, ""
			}
			if ov.SHA256 != "" {
				a.SHA256 = ov.SHA256
			}
			a.Pos = ov.Pos
		}
	}
	for _, ov := range o.Images {
		for i := range out.Images {
			im := &out.Images[i]
			if im.Name != ov.Name {
				continue
			}
			if ov.Source != "" {
				im.Source = ov.Source
			}
			if ov.Digest != "" {
				im.Digest = ov.Digest
			}
			im.Pos = ov.Pos
		}
	}
	return &out
}
