package spec

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	"gopkg.in/yaml.v3"

	"github.com/kilnproject/kiln/builder/output"
	"github.com/kilnproject/kiln/internal/strictyaml"
)

// The platforms, output formats and root filesystems a definition may name.
var (
	platforms = []string{"qemu", "aws", "gce", "metal"}
	formats   = output.Names()
	// compressions lists, per root filesystem type, the accepted
	// compression names; the first one is the default.
	compressions = map[string][]string{
		"squashfs": {"zstd", "gzip", "lz4", "lzo", "xz", "none"},
		"erofs":    {"lz4hc", "lz4", "none"},
	}
)

// Defaults applied when a definition leaves a field out.
const (
	defaultRootFS  = "squashfs"
	defaultESPSize = 256 * mib
	minESPSize     = 64 * mib
	defaultFormat  = "raw"
)

// Definition is an image definition, images/<name>.yaml: what to build.
type Definition struct {
	// File is the absolute path of the definition.
	File string
	// Name names the image and its lock file (<name>.lock next to File).
	Name     string
	Platform string
	Base     Base
	Disk     Disk
	// Formats are the output formats, in the order given; default [raw].
	Formats []string
	// ISO tunes the iso format; nil when the definition has no iso: field.
	ISO    *ISO
	Kernel Kernel
	// Overlays are absolute directories (<dir of File>/../overlays/<name>),
	// copied onto the root tree in this order.
	Overlays []string
	// ProfilesDir holds the role profiles, <role>.yaml; default
	// <dir of File>/../profiles.
	ProfilesDir string
	// ProfilesPos is where profiles was given (line 0 when defaulted).
	ProfilesPos Pos
}

// Base is the OS image the root tree starts from. Exactly one of Layout,
// Image and Tarball is set.
type Base struct {
	// Layout is an OCI image layout directory (absolute, variables expanded)
	// and Tag the org.opencontainers.image.ref.name of the image in its
	// index (may be empty if the index holds one image).
	Layout string
	Tag    string
	// Image is a registry reference without digest, e.g.
	// registry.example.com/debian:bookworm.
	Image string
	// Tarball is a `docker save` tarball (absolute, variables expanded).
	Tarball string
	// Digest is the sha256:… digest of the image manifest, from the
	// definition (digest: or image: …@sha256:…); empty means "from the lock".
	Digest string
	// Ref identifies the source portably, as written (before expansion):
	// "oci:<layout>:<tag>", "docker://<image>" or "docker-archive:<tarball>".
	// The lock file records base digests under it.
	Ref string
	Pos Pos
}

// Disk describes the disk image.
type Disk struct {
	// Size of the whole disk image; 0 means just large enough.
	Size Size
	// RootFS is squashfs or erofs; Compression one of Compressions[RootFS].
	RootFS      string
	Compression string
	ESPSize     Size
}

// ISO tunes the iso output (definition field iso:).
type ISO struct {
	// Install, when set, makes the ISO an installer: it carries the raw disk image compressed
	// and its default boot entry writes it to a disk (stage 1's install mode).
	Install *ISOInstall
}

// ISOInstall is iso.install: where the ISO's install entry writes the disk image.
type ISOInstall struct {
	// Dev is kiln.install.dev=: auto, /dev/<disk> or a /dev/disk/by-id name; default auto.
	Dev string
	// Wipe is kiln.install.wipe=1: write over a disk that holds data.
	Wipe bool
}

// Kernel holds what is added to the kernel command line and initramfs.
type Kernel struct {
	// Args follow kiln's own root=, rootfstype=, ro, kiln.platform= and kiln.verity.*.
	Args []string
	// Modules are extra modules (by name) for the initramfs.
	Modules []string
}

var (
	nameRE     = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
	dirNameRE  = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)
	moduleRE   = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)
	digestRE   = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)
	kernelArgs = []string{"root", "rootfstype", "ro", "rw", "kiln.platform", "kiln.verity.roothash", "kiln.verity.hashoffset"}
)

// LoadDefinition reads and validates the image definition at path. All
// problems are returned together; each is an *Error.
func LoadDefinition(path string) (*Definition, error) {
	d, root, abs, err := parse(path, "image definition")
	if err != nil {
		return nil, err
	}
	dir := filepath.Dir(abs)
	def := &Definition{
		File:        abs,
		Disk:        Disk{RootFS: defaultRootFS, ESPSize: defaultESPSize},
		ProfilesDir: filepath.Join(dir, "..", "profiles"),
		ProfilesPos: Pos{File: path},
	}
	var diskNode, isoNode *yaml.Node
	seen, _ := d.Fields(root, "", []string{"name", "platform", "base", "disk", "formats", "iso", "kernel", "overlays", "profiles"}, func(key, field string, v *yaml.Node) {
		switch key {
		case "name":
			if s, ok := d.String(v, field); ok {
				if !nameRE.MatchString(s) {
					d.FailAt(v, field, "%q: use lower-case letters, digits and '-' (at most 63)", s)
				}
				def.Name = s
			}
		case "platform":
			if s, ok := d.String(v, field); ok {
				if !contains(platforms, s) {
					d.FailAt(v, field, "%q is not a platform (one of: %s)", s, strings.Join(platforms, ", "))
				}
				def.Platform = s
			}
		case "base":
			def.Base = d.base(v, field, dir)
		case "disk":
			diskNode = v
			d.disk(v, field, &def.Disk)
		case "formats":
			def.Formats = d.strs(v, field, func(s, f string, n *yaml.Node) {
				if !contains(formats, s) {
					d.FailAt(n, f, "%q is not an output format (one of: %s)", s, strings.Join(formats, ", "))
				}
			})
		case "iso":
			isoNode = v
			def.ISO = d.iso(v, field)
		case "kernel":
			d.kernel(v, field, &def.Kernel)
		case "overlays":
			def.Overlays = d.overlays(v, field, filepath.Join(dir, "..", "overlays"))
		case "profiles":
			if s, ok := d.String(v, field); ok {
				p, err := expandPath(s, dir)
				if err != nil {
					d.FailAt(v, field, "%v", err)
					break
				}
				if fi, err := os.Stat(p); err != nil || !fi.IsDir() {
					d.FailAt(v, field, "%s is not a directory", p)
				}
				def.ProfilesDir, def.ProfilesPos = p, d.pos(v)
			}
		}
	})
	d.Require(root, "", seen, "name", "platform", "base")
	if def.Disk.Compression == "" {
		def.Disk.Compression = compressions[def.Disk.RootFS][0]
	}
	if len(def.Formats) == 0 && !seen["formats"] {
		def.Formats = []string{defaultFormat}
	}
	if diskNode != nil && def.Disk.Size != 0 && def.Disk.Size <= def.Disk.ESPSize {
		d.FailAt(diskNode, "disk.size", "%s leaves no room after the %s ESP", def.Disk.Size, def.Disk.ESPSize)
	}
	if diskNode != nil && def.Disk.Size%gib != 0 && contains(def.Formats, "gce") {
		d.FailAt(mapValue(diskNode, "size"), "disk.size", "%s is not a whole number of GiB, which the gce format needs (GCE images are whole GiB; leave size out to have it rounded up)", def.Disk.Size)
	}
	if isoNode != nil && !contains(def.Formats, "iso") {
		d.FailAt(isoNode, "iso", "tunes the iso format, which formats does not list (add iso to formats)")
	}
	if err := d.Err(); err != nil {
		return nil, err
	}
	return def, nil
}

func (d *decoder) base(n *yaml.Node, path, dir string) Base {
	b := Base{Pos: d.pos(n)}
	var sources []string
	var tagNode *yaml.Node
	seen, ok := d.Fields(n, path, []string{"layout", "tag", "image", "tarball", "digest"}, func(key, field string, v *yaml.Node) {
		s, ok := d.String(v, field)
		if !ok {
			return
		}
		switch key {
		case "layout", "tarball", "image":
			sources = append(sources, key)
			if len(sources) > 1 {
				d.FailAt(v, field, "give only one of layout, image or tarball (already have %s)", sources[0])
				return
			}
		}
		switch key {
		case "layout", "tarball":
			p, err := expandPath(s, dir)
			if err != nil {
				d.FailAt(v, field, "%v", err)
				return
			}
			if key == "layout" {
				b.Layout = p
				b.Ref = "oci:" + s
			} else {
				b.Tarball = p
				b.Ref = "docker-archive:" + s
			}
		case "tag":
			b.Tag, tagNode = s, v
		case "image":
			ref, err := name.ParseReference(s)
			if err != nil {
				d.FailAt(v, field, "%v", err)
				return
			}
			b.Ref = "docker://" + s
			b.Image = s
			if dg, ok := ref.(name.Digest); ok {
				b.Image = strings.TrimSuffix(s, "@"+dg.DigestStr())
				if b.Digest != "" && b.Digest != dg.DigestStr() {
					d.FailAt(v, field, "digest %s differs from digest: %s", dg.DigestStr(), b.Digest)
				}
				b.Digest = dg.DigestStr()
			}
		case "digest":
			if !digestRE.MatchString(s) {
				d.FailAt(v, field, "%q is not a digest (sha256: and 64 lower-case hex digits)", s)
				return
			}
			if b.Digest != "" && b.Digest != s {
				d.FailAt(v, field, "%s differs from the digest in image: %s", s, b.Digest)
			}
			b.Digest = s
		}
	})
	if !ok {
		return b
	}
	if len(sources) == 0 {
		d.FailAt(n, path, "one of layout, image or tarball is required")
	}
	if seen["tag"] && b.Layout == "" && tagNode != nil {
		d.FailAt(tagNode, strictyaml.Join(path, "tag"), "only used with layout (put the tag in image: name:tag)")
	}
	if b.Layout != "" && b.Tag != "" {
		b.Ref += ":" + b.Tag
	}
	return b
}

// mapValue returns the value of key in the mapping n, or n itself when it has none.
func mapValue(n *yaml.Node, key string) *yaml.Node {
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i+1]
		}
	}
	return n
}

func (d *decoder) disk(n *yaml.Node, path string, disk *Disk) {
	var compNode *yaml.Node
	d.Fields(n, path, []string{"size", "rootfs", "compression", "esp_size"}, func(key, field string, v *yaml.Node) {
		switch key {
		case "size", "esp_size":
			s, ok := d.size(v, field)
			if !ok {
				return
			}
			if s%mib != 0 {
				d.FailAt(v, field, "%s is not a whole number of MiB", s)
				return
			}
			if key == "size" {
				disk.Size = s
			} else if s < minESPSize {
				d.FailAt(v, field, "%s is too small for a FAT32 ESP (at least %s)", s, minESPSize)
			} else {
				disk.ESPSize = s
			}
		case "rootfs":
			if s, ok := d.String(v, field); ok {
				if _, known := compressions[s]; !known {
					d.FailAt(v, field, "%q is not a root filesystem type (squashfs or erofs)", s)
					return
				}
				disk.RootFS = s
			}
		case "compression":
			if s, ok := d.String(v, field); ok {
				disk.Compression, compNode = s, v
			}
		}
	})
	if allowed := compressions[disk.RootFS]; disk.Compression != "" && !contains(allowed, disk.Compression) {
		d.FailAt(compNode, strictyaml.Join(path, "compression"), "%q does not work with %s (one of: %s)", disk.Compression, disk.RootFS, strings.Join(allowed, ", "))
	}
}

// isoDevRE is what iso.install.dev may name besides auto: a /dev path or a /dev/disk/by-id name.
var isoDevRE = regexp.MustCompile(`^(/dev/[A-Za-z0-9._/:-]+|[A-Za-z0-9._:-]+)$`)

func (d *decoder) iso(n *yaml.Node, path string) *ISO {
	iso := &ISO{}
	d.Fields(n, path, []string{"install"}, func(key, field string, v *yaml.Node) {
		in := &ISOInstall{Dev: "auto"}
		iso.Install = in
		d.Fields(v, field, []string{"dev", "wipe"}, func(key, field string, v *yaml.Node) {
			switch key {
			case "dev":
				s, ok := d.String(v, field)
				if !ok {
					return
				}
				if s != "auto" && (!isoDevRE.MatchString(s) || strings.Contains(s, "..") || strings.HasSuffix(s, "/")) {
					d.FailAt(v, field, "%q: want auto, /dev/<disk> or a /dev/disk/by-id name (kiln.install.dev=)", s)
					return
				}
				in.Dev = s
			case "wipe":
				var b bool
				if v.Kind != yaml.ScalarNode || v.Decode(&b) != nil || v.Tag != "!!bool" {
					d.FailAt(v, field, "%s: want true (write over a disk holding data) or false", strictyaml.Describe(v))
					return
				}
				in.Wipe = b
			}
		})
	})
	return iso
}

func (d *decoder) kernel(n *yaml.Node, path string, k *Kernel) {
	d.Fields(n, path, []string{"args", "modules"}, func(key, field string, v *yaml.Node) {
		switch key {
		case "args":
			k.Args = d.strs(v, field, func(s, f string, n *yaml.Node) {
				if s == "" || strings.ContainsAny(s, " \t\r\n") {
					d.FailAt(n, f, "%q: one argument per list entry, without spaces", s)
					return
				}
				key, _, _ := strings.Cut(s, "=")
				if contains(kernelArgs, key) {
					d.FailAt(n, f, "%q: kiln sets %s= itself", s, key)
				}
			})
		case "modules":
			k.Modules = d.strs(v, field, func(s, f string, n *yaml.Node) {
				if !moduleRE.MatchString(s) {
					d.FailAt(n, f, "%q is not a module name (like virtio_blk, without .ko)", s)
				}
			})
		}
	})
}

// overlays resolves overlay names to existing directories <dir>/../overlays/<name>.
func (d *decoder) overlays(n *yaml.Node, field, overlaysDir string) []string {
	var out []string
	d.strs(n, field, func(s, f string, n *yaml.Node) {
		if !dirNameRE.MatchString(s) {
			d.FailAt(n, f, "%q: give the name of a directory under overlays/", s)
			return
		}
		p := filepath.Join(overlaysDir, s)
		if fi, err := os.Stat(p); err != nil || !fi.IsDir() {
			d.FailAt(n, f, "overlay %s: %s is not a directory", s, p)
			return
		}
		out = append(out, p)
	})
	return out
}
