package spec

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	"gopkg.in/yaml.v3"

	"github.com/kilnproject/kiln/internal/nodeimage"
	"github.com/kilnproject/kiln/internal/strictyaml"
)

// Kubernetes is what a role profile says about the Kubernetes its nodes
// run. The bake checks the binaries laid into the image against it.
type Kubernetes struct {
	// Version is a Kubernetes release, "v1.37.2".
	Version string
	// Runtime is "containerd" (default) or "docker" (dockerd + cri-dockerd).
	Runtime string
	Pos     Pos
}

// Image is a container image pre-pulled into the image (one OCI layout at
// /usr/lib/kiln/images), pinned by the digest of its linux/amd64 image
// manifest.
type Image struct {
	// Name is the full reference the node knows the image by, with a tag:
	// registry.k8s.io/pause:3.10.2.
	Name string
	// Source is where it is pulled from: a reference with a tag or a
	// digest; Name unless given.
	Source string
	// Digest is "sha256:<64 hex>" or empty: then the lock pins it.
	Digest string
	Pos    Pos
}

// Tag returns the tag of the image's name ("3.10.2").
func (im Image) Tag() string {
	t, err := name.NewTag(im.Name, name.StrictValidation)
	if err != nil {
		return ""
	}
	return t.TagStr()
}

var k8sVersionRE = regexp.MustCompile(`^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?$`)

func (d *decoder) kubernetes(n *yaml.Node, at string) *Kubernetes {
	runtimes := nodeimage.RuntimeNames() // the first is the default
	k := &Kubernetes{Pos: d.pos(n), Runtime: runtimes[0]}
	seen, ok := d.Fields(n, at, []string{"version", "runtime"}, func(key, field string, v *yaml.Node) {
		s, ok := d.String(v, field)
		if !ok {
			return
		}
		switch key {
		case "version":
			if !k8sVersionRE.MatchString(s) {
				d.FailAt(v, field, "%q is not a Kubernetes release (like v1.37.2)", s)
			}
			k.Version = s
		case "runtime":
			if !contains(runtimes, s) {
				d.FailAt(v, field, "%q is not a runtime (one of: %s)", s, strings.Join(runtimes, ", "))
			}
			k.Runtime = s
		}
	})
	if !ok {
		return nil
	}
	d.Require(n, at, seen, "version")
	return k
}

func (d *decoder) images(n *yaml.Node, at string) []Image {
	var out []Image
	names := map[string]bool{}
	d.list(n, at, func(item *yaml.Node, f string) {
		im := d.image(item, f)
		if im.Name != "" {
			if names[im.Name] {
				d.FailAt(item, f+".name", "%q used by an earlier image", im.Name)
			}
			names[im.Name] = true
		}
		out = append(out, im)
	})
	return out
}

func (d *decoder) image(n *yaml.Node, at string) Image {
	r, _, ok := d.imageRef(n, at, true)
	im := Image{Name: r.name, Source: r.source, Digest: r.digest, Pos: d.pos(n)}
	if ok && im.Source == "" {
		im.Source = im.Name
	}
	return im
}

// imageRef is what an image and an image override both give: the image's name, where it is
// pulled from and its digest.
type imageRef struct{ name, source, digest string }

// imageRef decodes name, source and digest. checkName asks for a full name with registry and
// tag. A digest in source becomes the digest; one given as well must match it. It reports
// which fields were given and whether n was a mapping.
func (d *decoder) imageRef(n *yaml.Node, at string, checkName bool) (imageRef, map[string]bool, bool) {
	var r imageRef
	var srcDigest string
	var srcNode *yaml.Node
	seen, ok := d.Fields(n, at, []string{"name", "source", "digest"}, func(key, field string, v *yaml.Node) {
		s, ok := d.String(v, field)
		if !ok {
			return
		}
		switch key {
		case "name":
			if checkName {
				if err := checkImageName(s); err != nil {
					d.FailAt(v, field, "%q: %v; want a full name with registry and tag, like registry.k8s.io/pause:3.10.2", s, err)
					return
				}
			}
			r.name = s
		case "source":
			dg, err := parseSource(s)
			if err != nil {
				d.FailAt(v, field, "%v", err)
				return
			}
			r.source, srcDigest, srcNode = s, dg, v
		case "digest":
			if !digestRE.MatchString(s) {
				d.FailAt(v, field, "%q is not a digest (sha256: and 64 lower-case hex digits)", s)
				return
			}
			r.digest = s
		}
	})
	if !ok {
		return r, nil, false
	}
	d.Require(n, at, seen, "name")
	if srcDigest != "" {
		if r.digest != "" && r.digest != srcDigest {
			d.FailAt(srcNode, strictyaml.Join(at, "source"), "digest %s differs from digest: %s", srcDigest, r.digest)
		}
		r.digest = srcDigest
	}
	return r, seen, true
}

// checkImageName says what is wrong with an image name, if anything.
func checkImageName(s string) error {
	first, rest, hasSlash := strings.Cut(s, "/")
	last := s[strings.LastIndex(s, "/")+1:]
	switch {
	case strings.Contains(s, "@"):
		return fmt.Errorf("a name has a tag, not a digest (give the digest as digest:)")
	case !hasSlash || rest == "" || !strings.ContainsAny(first, ".:") && first != "localhost":
		return fmt.Errorf("no registry")
	case !strings.Contains(last, ":"):
		return fmt.Errorf("no tag")
	}
	if _, err := name.NewTag(s, name.StrictValidation); err != nil {
		return err
	}
	return nil
}

// parseSource checks an image pull reference (registry, repository and a
// tag or a digest, all explicit) and returns its digest, if it has one.
func parseSource(s string) (digest string, err error) {
	bad := func(why any) error {
		return fmt.Errorf("%q: %v; want a reference with registry and tag or digest, like 127.0.0.1:5000/pause:3.10.2", s, why)
	}
	first, rest, hasSlash := strings.Cut(s, "/")
	last := s[strings.LastIndex(s, "/")+1:]
	switch {
	case !hasSlash || rest == "" || !strings.ContainsAny(first, ".:") && first != "localhost":
		return "", bad("no registry")
	case !strings.ContainsAny(last, ":@"):
		return "", bad("no tag or digest")
	}
	ref, err := name.ParseReference(s, name.StrictValidation)
	if err != nil {
		return "", bad(err)
	}
	if dg, ok := ref.(name.Digest); ok {
		if !digestRE.MatchString(dg.DigestStr()) {
			return "", fmt.Errorf("%q: only sha256 digests are accepted", s)
		}
		return dg.DigestStr(), nil
	}
	return "", nil
}
