package artifact

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/kilnproject/kiln/builder/spec"
	"github.com/kilnproject/kiln/internal/atomicfile"
)

// lockVersion is the version of the lock file format written by Write.
const lockVersion = 1

// Lock pins what the documents leave unpinned. It is stored as JSON, keys
// sorted, next to the definition:
//
//	{
//	  "version": 1,
//	  "base": {"ref": "oci:${KILN_CACHE}/base/bookworm:bookworm", "digest": "sha256:…"},
//	  "artifacts": {
//	    "worker/crictl": {"source": "https://…/crictl.tar.gz", "sha256": "…",
//	                      "pinnedFrom": "https://…/crictl.tar.gz.sha256"}
//	  },
//	  "images": {
//	    "worker/registry.k8s.io/pause:3.10.2": {"source": "registry.k8s.io/pause:3.10.2", "digest": "sha256:…"}
//	  }
//	}
//
// An entry counts only while it still matches the documents: the base entry
// while its ref equals the definition's base Ref, an artifact entry while
// its source equals the artifact's url or path as written, an image entry
// while its source equals the image's source (its name by default).
type Lock struct {
	Version   int                       `json:"version"`
	Base      *LockedBase               `json:"base,omitempty"`
	Artifacts map[string]LockedArtifact `json:"artifacts,omitempty"`
	Images    map[string]LockedImage    `json:"images,omitempty"`
}

// LockedImage is the digest of the image manifest (linux/amd64) that Source
// named when it was locked.
type LockedImage struct {
	Source string `json:"source"`
	Digest string `json:"digest"`
}

// LockedBase is the manifest digest of the base image named by Ref.
type LockedBase struct {
	Ref    string `json:"ref"`
	Digest string `json:"digest"`
}

// LockedArtifact is the sha256 of an artifact's content at Source.
type LockedArtifact struct {
	Source string `json:"source"`
	SHA256 string `json:"sha256"`
	// PinnedFrom says where the pin came from: the URL of the publisher's checksum file that
	// confirmed the first download, or PinnedByDownload when none was beside the file (the
	// sha256 is then the first download's alone). Empty in locks written before kiln
	// recorded it.
	PinnedFrom string `json:"pinnedFrom,omitempty"`
}

// LockPath returns the lock file of def: <name>.lock next to it.
func LockPath(def *spec.Definition) string {
	return filepath.Join(filepath.Dir(def.File), def.Name+".lock")
}

// lockKey names an artifact or image of a role in the lock: "<role>/<name>".
func lockKey(role, name string) string { return role + "/" + name }

// ReadLock reads the lock file at path; a missing file is an empty lock.
func ReadLock(path string) (*Lock, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return &Lock{Version: lockVersion}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("lock file: %w", err)
	}
	var l Lock
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&l); err != nil {
		return nil, fmt.Errorf("lock file %s: %w (remove it and run kiln lock)", path, err)
	}
	if l.Version != lockVersion {
		return nil, fmt.Errorf("lock file %s: version %d, this kiln reads version %d", path, l.Version, lockVersion)
	}
	if l.Base != nil && !validDigest(l.Base.Digest) {
		return nil, fmt.Errorf("lock file %s: base digest %q is not sha256:<64 hex>", path, l.Base.Digest)
	}
	for k, a := range l.Artifacts {
		if !hexRE.MatchString(a.SHA256) {
			return nil, fmt.Errorf("lock file %s: artifact %s: sha256 %q is not 64 lower-case hex digits", path, k, a.SHA256)
		}
	}
	for k, im := range l.Images {
		if !validDigest(im.Digest) {
			return nil, fmt.Errorf("lock file %s: image %s: digest %q is not sha256:<64 hex>", path, k, im.Digest)
		}
	}
	return &l, nil
}

// Write stores the lock at path atomically, as indented JSON with sorted
// keys and a final newline, so that the same lock always gives the same
// bytes.
func (l *Lock) Write(path string) error {
	out := *l
	out.Version = lockVersion
	data, err := json.MarshalIndent(&out, "", "  ")
	if err != nil {
		return fmt.Errorf("lock file: %w", err)
	}
	data = append(data, '\n')
	if err := atomicfile.Write(path, data, atomicfile.Options{Mode: 0o644}); err != nil {
		return fmt.Errorf("lock file: %w", err)
	}
	return nil
}

// SHA256 returns the sha256 pinning artifact a of role: the profile's own,
// else the lock's if its source still matches, else "".
func (l *Lock) SHA256(role string, a spec.Artifact) string {
	if a.SHA256 != "" || l == nil {
		return a.SHA256
	}
	return lockedPin(l.Artifacts, lockKey(role, a.Name), a.Source)
}

// imageDigest returns the manifest digest pinning image im of role: the
// profile's own, else the lock's if its source still matches, else "".
func (l *Lock) imageDigest(role string, im spec.Image) string {
	if im.Digest != "" || l == nil {
		return im.Digest
	}
	return lockedPin(l.Images, lockKey(role, im.Name), im.Source)
}

// lockedPin returns the pin locked under key if it was locked from source
// (a changed source makes it stale), else "".
func lockedPin[E lockEntry](entries map[string]E, key, source string) string {
	if e, ok := entries[key]; ok {
		if src, pin := e.locked(); src == source {
			return pin
		}
	}
	return ""
}

// lockEntry is an entry of a lock file's artifacts or images.
type lockEntry interface {
	locked() (source, pin string)
}

func (e LockedArtifact) locked() (string, string) { return e.Source, e.SHA256 }
func (e LockedImage) locked() (string, string)    { return e.Source, e.Digest }

// BaseDigest returns the manifest digest pinning b: the definition's own,
// else the lock's if its ref still matches, else "".
func (l *Lock) BaseDigest(b spec.Base) string {
	if b.Digest != "" {
		return b.Digest
	}
	if l != nil && l.Base != nil && l.Base.Ref == b.Ref {
		return l.Base.Digest
	}
	return ""
}

// Unpinned lists, as "file:line: field: problem" lines, what def and p
// leave unpinned given l. Bake refuses to run while it is not empty.
// p may be nil.
func Unpinned(def *spec.Definition, p *spec.Profile, l *Lock) []string {
	var out []string
	if def != nil && l.BaseDigest(def.Base) == "" {
		out = append(out, spec.Errorf(def.Base.Pos, "base", "%s is not pinned: no digest here or in %s (run kiln lock)", def.Base.Ref, filepath.Base(LockPath(def))).Error())
	}
	if p != nil {
		for _, a := range p.Artifacts {
			if l.SHA256(p.Role, a) == "" {
				out = append(out, spec.Errorf(a.Pos, "artifacts", "%q (%s) is not pinned: no sha256 here or in the lock file (run kiln lock)", a.Name, a.Source).Error())
			}
		}
		for _, im := range p.Images {
			if l.imageDigest(p.Role, im) == "" {
				out = append(out, spec.Errorf(im.Pos, "images", "%q (%s) is not pinned: no digest here or in the lock file (run kiln lock)", im.Name, im.Source).Error())
			}
		}
	}
	return out
}

// ImageSources returns an ImageSource for every image of p, pinned by the
// profile or by l; it fails, listing them, if any is unpinned.
func ImageSources(p *spec.Profile, l *Lock) ([]ImageSource, error) {
	if u := Unpinned(nil, p, l); len(u) > 0 {
		return nil, fmt.Errorf("profile %s: unpinned inputs:\n%s", p.Role, joinLines(u))
	}
	out := make([]ImageSource, 0, len(p.Images))
	for _, im := range p.Images {
		out = append(out, ImageSource{Name: im.Name, Source: im.Source, Digest: l.imageDigest(p.Role, im)})
	}
	return out, nil
}

// Sources returns a Source for every artifact of p, pinned by the profile
// or by l; it fails, listing them, if any is unpinned.
func Sources(p *spec.Profile, l *Lock) ([]Source, error) {
	if u := Unpinned(nil, p, l); len(u) > 0 {
		return nil, fmt.Errorf("profile %s: unpinned artifacts:\n%s", p.Role, joinLines(u))
	}
	out := make([]Source, 0, len(p.Artifacts))
	for _, a := range p.Artifacts {
		out = append(out, Source{Name: a.Name, URL: a.URL, Path: a.Path, SHA256: l.SHA256(p.Role, a)})
	}
	return out, nil
}

func joinLines(lines []string) string {
	var b bytes.Buffer
	for i, s := range lines {
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(s)
	}
	return b.String()
}

// BaseResolver finds the manifest digest ("sha256:…") of a base image from
// its tag. OCIResolver implements it for layouts, registries and tarballs.
type BaseResolver interface {
	ResolveBase(ctx context.Context, b spec.Base) (digest string, err error)
}

// Pinner makes lock files (`kiln lock`).
type Pinner struct {
	Cache    *Cache
	Resolver BaseResolver
	// Images resolves image tags; when nil, Resolver is used if it is an
	// imageResolver too (OCIResolver is).
	Images imageResolver
	// Update re-resolves and re-downloads entries the old lock already has.
	Update bool
}

// Pin returns the lock def and profiles need: the base digest unless the
// definition gives one, and a sha256 for every artifact whose profile
// gives none. Entries of old that still match are kept (unless Update);
// the others are resolved or downloaded once into the cache; images are
// resolved to their linux/amd64 manifest digest (a HEAD request, no layer
// is downloaded). Entries no
// longer needed are dropped, so pass every profile the image is baked with
// (spec.LoadProfiles). The notes say, one line each, what was pinned anew.
func (pn *Pinner) Pin(ctx context.Context, def *spec.Definition, profiles []*spec.Profile, old *Lock) (*Lock, []string, error) {
	if old == nil || pn.Update {
		old = &Lock{}
	}
	l := &Lock{Version: lockVersion}
	var notes []string
	if def.Base.Digest == "" {
		if d := old.BaseDigest(def.Base); d != "" {
			l.Base = &LockedBase{Ref: def.Base.Ref, Digest: d}
		} else {
			if pn.Resolver == nil {
				return nil, nil, fmt.Errorf("%s: base %s: no resolver to pin it with", def.Base.Pos, def.Base.Ref)
			}
			d, err := pn.Resolver.ResolveBase(ctx, def.Base)
			if err != nil {
				return nil, nil, fmt.Errorf("%s: base: %w", def.Base.Pos, err)
			}
			if !validDigest(d) {
				return nil, nil, fmt.Errorf("%s: base %s: resolver returned %q, not a sha256 digest", def.Base.Pos, def.Base.Ref, d)
			}
			l.Base = &LockedBase{Ref: def.Base.Ref, Digest: d}
			notes = append(notes, fmt.Sprintf("pinned base %s to %s", def.Base.Ref, d))
		}
	}
	for _, p := range profiles {
		for _, a := range p.Artifacts {
			if a.SHA256 != "" {
				continue
			}
			key := lockKey(p.Role, a.Name)
			entry := LockedArtifact{Source: a.Source, SHA256: old.SHA256(p.Role, a)}
			if entry.SHA256 != "" {
				entry.PinnedFrom = old.Artifacts[key].PinnedFrom
			} else {
				var note string
				var err error
				if entry, note, err = pn.pinArtifact(ctx, key, a); err != nil {
					return nil, nil, fmt.Errorf("%s: %w", a.Pos, err)
				}
				notes = append(notes, note)
			}
			if l.Artifacts == nil {
				l.Artifacts = map[string]LockedArtifact{}
			}
			l.Artifacts[key] = entry
		}
		for _, im := range p.Images {
			if im.Digest != "" {
				continue
			}
			key := lockKey(p.Role, im.Name)
			d := old.imageDigest(p.Role, im)
			if d == "" {
				ir := pn.Images
				if ir == nil {
					ir, _ = pn.Resolver.(imageResolver)
				}
				if ir == nil {
					return nil, nil, fmt.Errorf("%s: image %s: no resolver to pin it with", im.Pos, im.Name)
				}
				var err error
				if d, err = ir.ResolveImage(ctx, im.Source); err != nil {
					return nil, nil, fmt.Errorf("%s: image %q: %w", im.Pos, im.Name, err)
				}
				if !validDigest(d) {
					return nil, nil, fmt.Errorf("%s: image %q: resolver returned %q, not a sha256 digest", im.Pos, im.Name, d)
				}
				notes = append(notes, fmt.Sprintf("pinned %s: %s is %s", key, im.Source, d))
			}
			if l.Images == nil {
				l.Images = map[string]LockedImage{}
			}
			l.Images[key] = LockedImage{Source: im.Source, Digest: d}
		}
	}
	return l, notes, nil
}

// pinArtifact downloads a once into the cache and checks its sha256 against the publisher's
// checksum (the profile's checksum URL, else a checksum file beside a URL); it returns the
// lock entry and a note saying what was pinned and how.
func (pn *Pinner) pinArtifact(ctx context.Context, key string, a spec.Artifact) (LockedArtifact, string, error) {
	sum, _, err := pn.Cache.Add(ctx, Source{Name: a.Name, URL: a.URL, Path: a.Path})
	if err != nil {
		return LockedArtifact{}, "", err
	}
	from := PinnedByDownload
	if a.URL != "" || a.ChecksumURL != "" {
		name := a.URL
		if name == "" {
			name = a.Path
		}
		if from, err = pn.Cache.checkPublisherSum(ctx, name, a.ChecksumURL, sum); err != nil {
			return LockedArtifact{}, "", fmt.Errorf("artifact %s: %w", a.Name, err)
		}
	}
	note := fmt.Sprintf("pinned %s: downloaded %s once, sha256 %s", key, a.Source, sum)
	if from == PinnedByDownload {
		note += ", no publisher's checksum beside it to check"
	} else {
		note += ", as the publisher's " + from + " says"
	}
	return LockedArtifact{Source: a.Source, SHA256: sum, PinnedFrom: from}, note, nil
}

func validDigest(d string) bool {
	return len(d) == len("sha256:")+64 && d[:7] == "sha256:" && hexRE.MatchString(d[7:])
}
