package netboot

import (
	"cmp"
	"crypto"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"path/filepath"
	"strings"
	"time"
)

// Options configure a Server.
type Options struct {
	// Dir is the served directory: baked outputs (<image>-<role>.json, <image>-<role>-pxe/,
	// raw images).
	Dir string
	// Machines is machines.yaml's path; "" means Dir/machines.yaml.
	Machines string
	// AdvertiseURL is the base URL scripts and kernel parameters use (http://10.0.0.2:8080,
	// or an https URL of a proxy in front); "" takes it from each request's Host.
	AdvertiseURL string
	// AllowSecrets serves configs that hold private keys or tokens, with a warning per
	// config file; without it Load refuses them.
	AllowSecrets bool
	// StallTimeout cuts a response whose client takes less than 256 KiB of it in that
	// long; 0 means DefaultStallTimeout.
	StallTimeout time.Duration
	// MaxConns is how many connections Serve holds open at once; more wait to be
	// accepted. 0 means DefaultMaxConns.
	MaxConns int
	// VerifyKey, when set, is the public key every served image's signed provenance
	// (<image>-<role>.intoto.jsonl) must verify with; Load refuses an image that does not,
	// and an install image the bake's metadata does not record.
	VerifyKey crypto.PublicKey
	Log       *slog.Logger
}

// Defaults of Options' limits.
const (
	DefaultStallTimeout = 2 * time.Minute
	DefaultMaxConns     = 1024
)

// Server answers machines booting from the network. Everything it serves is read and
// checked by Load; a Server holds no mutable state and serves requests concurrently.
type Server struct {
	log       *slog.Logger
	advertise string
	stall     time.Duration
	maxConns  int
	files     map[string]*servedFile // by name under /images/
	byID      map[string]*entry
	byMAC     map[string]*entry
	byUUID    map[string]*entry
	byHost    map[string]*entry
}

// entry is one machine as served: its image, install image and rendered config.
type entry struct {
	*Machine
	image   *image
	install *servedFile
	// config is the machine's Ignition JSON, nil when it has none; configETag its ETag.
	config     []byte
	configETag string
}

// Load reads machines.yaml and everything its machines boot: each image's pxe files and
// install image, hashed and compared with the recorded sha256, and each machine's config,
// rendered, checked and scanned for secrets (refused unless o.AllowSecrets). It reports
// every problem it finds, each naming its file (and line in machines.yaml).
func Load(o Options) (*Server, error) {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.StallTimeout < 0 || o.MaxConns < 0 {
		return nil, fmt.Errorf("stall timeout %s, max conns %d: limits cannot be negative", o.StallTimeout, o.MaxConns)
	}
	if o.Machines == "" {
		o.Machines = filepath.Join(o.Dir, "machines.yaml")
	}
	advertise, err := CheckAdvertiseURL(o.AdvertiseURL)
	if err != nil {
		return nil, err
	}
	ms, err := LoadMachines(o.Machines)
	if err != nil {
		return nil, err
	}
	s := &Server{log: o.Log, advertise: advertise,
		stall: cmp.Or(o.StallTimeout, DefaultStallTimeout), maxConns: cmp.Or(o.MaxConns, DefaultMaxConns),
		byID: map[string]*entry{}, byMAC: map[string]*entry{}, byUUID: map[string]*entry{}, byHost: map[string]*entry{}}
	start := time.Now()
	table := newFileTable(o.Dir, o.Log)
	table.key = o.VerifyKey
	secrets := newSecretConfigs()
	var errs []error
	for _, g := range ms.Groups {
		errs = append(errs, s.addGroup(ms.Path, table, secrets, g)...)
	}
	errs = append(errs, secrets.report(o.AllowSecrets, o.Log)...)
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	s.files = table.files
	o.Log.Info("machines loaded", "machines", len(s.byID), "files", len(s.files), "seconds", time.Since(start).Seconds())
	return s, nil
}

// addGroup loads g's image, install image and config (scanned for secrets) and adds its
// machines.
func (s *Server) addGroup(file string, table *fileTable, secrets *secretConfigs, g *Group) []error {
	at := func(key string, err error) error {
		return fmt.Errorf("%s:%d: %s.%s: %w", file, g.lines[key], g.field, key, err)
	}
	im, err := table.image(g.Image)
	if err != nil {
		return []error{at("image", err)}
	}
	var errs []error
	var install *servedFile
	if g.Mode == ModeInstall {
		if install, err = table.installImage(im, g.Install.Image); err != nil {
			errs = append(errs, at("install", err))
		}
	}
	var gc *groupConfig
	if g.Config != "" {
		if gc, err = loadGroupConfig(g.Config); err != nil {
			return append(errs, at("config", err))
		}
		if err := secrets.check(gc, fmt.Sprintf("%s:%d: %s.config", file, g.lines["config"], g.field), g.Machines); err != nil {
			errs = append(errs, at("config", err))
		}
	}
	for _, m := range g.Machines {
		e := &entry{Machine: m, image: im, install: install}
		if gc != nil || m.Hostname != "" || m.EtcdMember != "" {
			if e.config, err = render(gc, m); err != nil {
				errs = append(errs, fmt.Errorf("%s:%d: %s: %w", file, m.line, m.field, err))
				continue
			}
			sum := sha256.Sum256(e.config)
			e.configETag = `"sha256-` + hex.EncodeToString(sum[:]) + `"`
		}
		s.add(e)
	}
	return errs
}

// add indexes e by its ID and selector values (machines.yaml's parser refused duplicates).
func (s *Server) add(e *entry) {
	s.byID[e.ID] = e
	for _, v := range e.Selector.MACs {
		s.byMAC[v] = e
	}
	for _, v := range e.Selector.UUIDs {
		s.byUUID[v] = e
	}
	for _, v := range e.Selector.Hostnames {
		s.byHost[v] = e
	}
}

// CheckAdvertiseURL accepts a base URL for --advertise-url: http(s), no query or fragment,
// nothing a kernel command line cannot hold. It returns it without a trailing slash.
func CheckAdvertiseURL(s string) (string, error) {
	if s == "" {
		return "", nil
	}
	u, err := url.Parse(s)
	switch {
	case err != nil:
		return "", fmt.Errorf("--advertise-url: %w", err)
	case u.Scheme != "http" && u.Scheme != "https", u.Host == "", u.RawQuery != "", u.Fragment != "", u.User != nil:
		return "", fmt.Errorf("--advertise-url %q: want http(s)://HOST[:PORT][/PATH]", s)
	case !safeArg.MatchString(s):
		return "", fmt.Errorf("--advertise-url %q: only printable ASCII without spaces or quotes (it goes on kernel command lines)", s)
	}
	return strings.TrimSuffix(s, "/"), nil
}
