package netboot

import (
	"fmt"
	"net"
	"path/filepath"
	"regexp"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/kilnproject/kiln/internal/strictyaml"
)

// Mode is how a group's machines run.
type Mode string

// The modes.
const (
	// ModeLive runs the image from RAM: stage 1 fetches rootfs.img over HTTP.
	ModeLive Mode = "live"
	// ModeInstall writes the raw image to a disk and reboots into it.
	ModeInstall Mode = "install"
)

// Machines is a parsed machines.yaml.
type Machines struct {
	// Path is the file's name as given; configs are relative to its directory.
	Path   string
	Groups []*Group
}

// Group is one entry of groups: what its machines boot and how.
type Group struct {
	Name  string
	Image string // <image>-<role>
	Mode  Mode
	// Install is set for ModeInstall.
	Install *Install
	// Config is the node config's path ("" for none: first boot uses the image's own).
	Config string
	// KernelArgs are added to every machine's command line.
	KernelArgs []string
	// Machines are the group's members: first the group-wide selector's (ID the group's
	// name, no per-machine values), then the per-machine entries.
	Machines []*Machine
	// field is "groups[i]" and line its line, for errors found after parsing.
	field string
	line  int
	// lines are the lines of its fields' values, by key.
	lines map[string]int
}

// Install is a group's install settings (kiln.install.*).
type Install struct {
	// Dev is the target disk: auto, /dev/… or a /dev/disk/by-id name.
	Dev  string
	Wipe bool
	// Image is the served file to install, in the served directory; "" means the bake's
	// raw output.
	Image string
}

// Machine is one member of a group.
type Machine struct {
	// ID names the machine's config: /config/<ID>. A per-machine entry's name (default its
	// hostname); the group's name for the group-wide selector.
	ID         string
	Group      *Group
	Selector   Selector
	Hostname   string
	EtcdMember string
	KernelArgs []string
	field      string
	line       int
}

// Selector lists the MACs (aa:bb:cc:dd:ee:ff), SMBIOS UUIDs (lower case) and DHCP hostnames
// (lower case) that pick a machine, normalised.
type Selector struct {
	MACs, UUIDs, Hostnames []string
}

func (s Selector) empty() bool { return len(s.MACs)+len(s.UUIDs)+len(s.Hostnames) == 0 }

// LoadMachines reads and checks machines.yaml at path. Every problem is reported, each as
// "file:line: field: problem"; a MAC, UUID or hostname claimed twice is one.
func LoadMachines(path string) (*Machines, error) {
	data, err := readRegular(path)
	if err != nil {
		return nil, fmt.Errorf("machines: %w", err)
	}
	return ParseMachines(data, path)
}

// ParseMachines parses machines.yaml's contents; path is the name errors start with and
// the directory relative config paths are resolved in.
func ParseMachines(data []byte, path string) (*Machines, error) {
	p := &machinesParser{Doc: strictyaml.NewDoc(path), claims: map[string]claim{}, ids: map[string]claim{}}
	m := &Machines{Path: path}
	root := p.Parse(data)
	if root == nil {
		return nil, p.Err()
	}
	seen, _ := p.Fields(root, "", []string{"groups"}, func(_, field string, v *yaml.Node) {
		p.list(v, field, func(item *yaml.Node, at string) {
			if g := p.group(item, at, filepath.Dir(path)); g != nil {
				m.Groups = append(m.Groups, g)
			}
		})
	})
	p.Require(root, "", seen, "groups")
	if err := p.ErrByLine(); err != nil {
		return nil, err
	}
	return m, nil
}

// machinesParser walks machines.yaml, remembering which entry claimed each selector value
// and each config ID.
type machinesParser struct {
	*strictyaml.Doc
	claims map[string]claim // "mac 52:54:…" → its first claim
	ids    map[string]claim
}

type claim struct {
	field string
	line  int
}

func (p *machinesParser) list(n *yaml.Node, field string, each func(*yaml.Node, string)) {
	n = strictyaml.Deref(n)
	if n.Kind != yaml.SequenceNode {
		p.FailAt(n, field, "expected a list, got %s", strictyaml.Describe(n))
		return
	}
	for i, item := range n.Content {
		each(strictyaml.Deref(item), strictyaml.Index(field, i))
	}
}

func (p *machinesParser) group(n *yaml.Node, at, dir string) *Group {
	g := &Group{field: at, line: n.Line, lines: map[string]int{}}
	var selNode, machinesNode *yaml.Node
	seen, ok := p.Fields(n, at, []string{"name", "selector", "image", "mode", "install", "config", "kernelArgs", "machines"},
		func(key, field string, v *yaml.Node) {
			g.lines[key] = v.Line
			switch key {
			case "name":
				g.Name = p.label(v, field)
				p.claimID(g.Name, field, v.Line)
			case "selector":
				selNode = v
			case "image":
				g.Image = p.fileName(v, field)
			case "mode":
				if s, _ := p.String(v, field); s != "" && s != string(ModeLive) && s != string(ModeInstall) {
					p.FailAt(v, field, "%q is not a mode (live or install)", s)
				} else {
					g.Mode = Mode(s)
				}
			case "install":
				g.Install = p.install(v, field)
			case "config":
				if s, ok := p.String(v, field); ok {
					g.Config = s
					if !filepath.IsAbs(s) {
						g.Config = filepath.Join(dir, s)
					}
				}
			case "kernelArgs":
				g.KernelArgs = p.kernelArgs(v, field)
			case "machines":
				machinesNode = v
			}
		})
	if !ok {
		return nil
	}
	p.Require(n, at, seen, "name", "image", "mode")
	switch {
	case g.Mode == ModeInstall && g.Install == nil:
		g.Install = &Install{Dev: "auto"}
	case g.Mode == ModeLive && g.Install != nil:
		p.Failf(strictyaml.Join(at, "install"), "only for mode: install")
	}
	p.members(g, selNode, machinesNode)
	return g
}

// members adds the group-wide selector's member and the per-machine entries to g.
func (p *machinesParser) members(g *Group, selNode, machinesNode *yaml.Node) {
	if selNode != nil {
		m := &Machine{ID: g.Name, Group: g, field: strictyaml.Join(g.field, "selector"), line: selNode.Line}
		m.Selector = p.selector(selNode, m.field)
		g.Machines = append(g.Machines, m)
	}
	if machinesNode != nil {
		p.list(machinesNode, strictyaml.Join(g.field, "machines"), func(item *yaml.Node, at string) {
			if m := p.machine(item, at); m != nil {
				m.Group = g
				g.Machines = append(g.Machines, m)
			}
		})
	}
	if len(g.Machines) == 0 {
		p.Failf(g.field, "matches no machine: give it a selector or machines")
	}
}

func (p *machinesParser) machine(n *yaml.Node, at string) *Machine {
	m := &Machine{field: at, line: n.Line}
	nameLine := n.Line
	seen, ok := p.Fields(n, at, []string{"name", "selector", "hostname", "etcdMember", "kernelArgs"},
		func(key, field string, v *yaml.Node) {
			switch key {
			case "name":
				m.ID, nameLine = p.label(v, field), v.Line
			case "selector":
				m.Selector = p.selector(v, field)
			case "hostname":
				m.Hostname = p.hostname(v, field)
			case "etcdMember":
				m.EtcdMember = p.label(v, field)
			case "kernelArgs":
				m.KernelArgs = p.kernelArgs(v, field)
			}
		})
	if !ok {
		return nil
	}
	p.Require(n, at, seen, "selector")
	if m.ID == "" {
		m.ID = m.Hostname
	}
	if m.ID == "" {
		p.FailAt(n, at, "needs a name or a hostname (its config is served as /config/<name>)")
	} else {
		p.claimID(m.ID, at, nameLine)
	}
	return m
}

func (p *machinesParser) install(n *yaml.Node, at string) *Install {
	in := &Install{Dev: "auto"}
	p.Fields(n, at, []string{"dev", "wipe", "image"}, func(key, field string, v *yaml.Node) {
		switch key {
		case "dev":
			if s, ok := p.String(v, field); ok {
				if err := checkInstallDev(s); err != nil {
					p.FailAt(v, field, "%v", err)
				}
				in.Dev = s
			}
		case "wipe":
			if v.Kind != yaml.ScalarNode || v.Tag != "!!bool" {
				p.FailAt(v, field, "expected true or false, got %s", strictyaml.Describe(v))
				return
			}
			in.Wipe = v.Value == "true"
		case "image":
			in.Image = p.fileName(v, field)
		}
	})
	return in
}

// checkInstallDev accepts what kiln.install.dev= takes: auto, a /dev path, a by-id name.
func checkInstallDev(s string) error {
	switch {
	case s == "auto":
		return nil
	case strings.HasPrefix(s, "/dev/") && filepath.Clean(s) == s && safeArg.MatchString(s):
		return nil
	case !strings.Contains(s, "/") && safeArg.MatchString(s) && s != "." && s != "..":
		return nil
	}
	return fmt.Errorf("%q is not auto, a /dev/… path or a /dev/disk/by-id name", s)
}

// selector parses {mac, uuid, hostname}, each a string or a list of them, normalising and
// claiming every value.
func (p *machinesParser) selector(n *yaml.Node, at string) Selector {
	var s Selector
	given := 0
	_, ok := p.Fields(n, at, []string{"mac", "uuid", "hostname"}, func(key, field string, v *yaml.Node) {
		p.stringOrList(v, field, func(item *yaml.Node, f string) {
			given++
			val, ok := p.String(item, f)
			if !ok {
				return
			}
			norm, err := normalise(key, val)
			if err != nil {
				p.FailAt(item, f, "%v", err)
				return
			}
			if first, dup := p.claims[key+" "+norm]; dup {
				p.FailAt(item, f, "%s %s is already claimed by %s (line %d): a machine belongs to one entry", key, norm, first.field, first.line)
				return
			}
			p.claims[key+" "+norm] = claim{f, item.Line}
			switch key {
			case "mac":
				s.MACs = append(s.MACs, norm)
			case "uuid":
				s.UUIDs = append(s.UUIDs, norm)
			case "hostname":
				s.Hostnames = append(s.Hostnames, norm)
			}
		})
	})
	if ok && given == 0 {
		p.FailAt(n, at, "selects nothing: give a mac, uuid or hostname")
	}
	return s
}

func (p *machinesParser) stringOrList(n *yaml.Node, field string, each func(*yaml.Node, string)) {
	if n.Kind == yaml.SequenceNode {
		if len(n.Content) == 0 {
			p.FailAt(n, field, "is an empty list")
		}
		p.list(n, field, each)
		return
	}
	each(n, field)
}

// normalise returns a selector value in the form lookups use.
func normalise(kind, v string) (string, error) {
	switch kind {
	case "mac":
		return normaliseMAC(v)
	case "uuid":
		return normaliseUUID(v)
	default:
		h := strings.ToLower(v)
		if !isDNSName(h) {
			return "", fmt.Errorf("%q is not a host name", v)
		}
		return h, nil
	}
}

// normaliseMAC accepts a 6-byte MAC with colons, hyphens (iPXE's hexhyp) or dots and
// returns it as aa:bb:cc:dd:ee:ff.
func normaliseMAC(v string) (string, error) {
	hw, err := net.ParseMAC(v)
	if err != nil || len(hw) != 6 {
		return "", fmt.Errorf("%q is not a MAC address such as 52:54:00:12:34:56", v)
	}
	return hw.String(), nil
}

var uuidRE = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

// normaliseUUID accepts an SMBIOS UUID in its 8-4-4-4-12 form; all zeros and all ones (what
// firmware without a UUID reports) are refused.
func normaliseUUID(v string) (string, error) {
	u := strings.ToLower(v)
	switch {
	case !uuidRE.MatchString(u):
		return "", fmt.Errorf("%q is not a UUID such as 4c4c4544-0042-3510-8052-b4c04f4e4432", v)
	case u == "00000000-0000-0000-0000-000000000000" || u == "ffffffff-ffff-ffff-ffff-ffffffffffff":
		return "", fmt.Errorf("%s is what firmware without a UUID reports; it cannot tell machines apart", u)
	}
	return u, nil
}

func (p *machinesParser) claimID(id, field string, line int) {
	if id == "" {
		return
	}
	if first, dup := p.ids[id]; dup {
		p.Fail(line, field, fmt.Errorf("name %q is already used by %s (line %d): group and machine names must be unique", id, first.field, first.line))
		return
	}
	p.ids[id] = claim{field, line}
}

var (
	dnsLabel = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
	// plainName is a file name in the served directory.
	plainName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._+-]*$`)
	// safeArg is what a kernel argument may hold: printable ASCII without spaces or quotes.
	safeArg = regexp.MustCompile(`^[!#-&(-~]+$`)
)

func isDNSName(s string) bool {
	if s == "" || len(s) > 253 {
		return false
	}
	for _, l := range strings.Split(s, ".") {
		if !dnsLabel.MatchString(l) {
			return false
		}
	}
	return true
}

func (p *machinesParser) label(n *yaml.Node, field string) string {
	s, ok := p.String(n, field)
	if ok && !dnsLabel.MatchString(s) {
		p.FailAt(n, field, "%q is not an RFC 1123 label (lower-case letters, digits and -)", s)
		return ""
	}
	return s
}

func (p *machinesParser) hostname(n *yaml.Node, field string) string {
	s, ok := p.String(n, field)
	if ok && !isDNSName(s) {
		p.FailAt(n, field, "%q is not an RFC 1123 host name", s)
		return ""
	}
	return s
}

func (p *machinesParser) fileName(n *yaml.Node, field string) string {
	s, ok := p.String(n, field)
	if ok && (!plainName.MatchString(s) || strings.Contains(s, "..")) {
		p.FailAt(n, field, "%q is not a plain file name in the served directory", s)
		return ""
	}
	return s
}

// reservedArgs are the kernel parameters kiln serve sets itself.
var reservedArgs = []string{"root=", "initrd=", "kiln.live.", "kiln.install.", "kiln.config.url="}

// kernelArgs parses a space-separated string of kernel arguments.
func (p *machinesParser) kernelArgs(n *yaml.Node, field string) []string {
	s, ok := p.String(n, field)
	if !ok {
		return nil
	}
	args := strings.Fields(s)
	for _, a := range args {
		if !safeArg.MatchString(a) {
			p.FailAt(n, field, "%q: kernel arguments are printable ASCII without quotes", a)
			continue
		}
		for _, r := range reservedArgs {
			if strings.HasPrefix(a, r) {
				p.FailAt(n, field, "%q: kiln serve sets %s… itself", a, r)
			}
		}
	}
	return args
}
