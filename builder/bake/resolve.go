package bake

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/kilnproject/kiln/builder/artifact"
	"github.com/kilnproject/kiln/builder/spec"
)

// resolve loads the definition at file and the profile of role, applies the profile overlays,
// checks the kernel arguments against the profile's Kubernetes release and reads the lock. It
// refuses a bake with an input that neither the definition, the profile nor the lock pins.
func resolve(file, role string, overlays []string, log *slog.Logger) (*spec.Definition, *spec.Profile, *artifact.Lock, error) {
	def, err := spec.LoadDefinition(file)
	if err != nil {
		return nil, nil, nil, err
	}
	prof, err := def.Profile(role)
	if err != nil {
		return nil, nil, nil, err
	}
	if prof, err = applyOverlays(def, prof, overlays, log); err != nil {
		return nil, nil, nil, err
	}
	if k := prof.Kubernetes; k != nil {
		if err := checkKernelArgs(*k, def.Kernel.Args); err != nil {
			return nil, nil, nil, fmt.Errorf("%s: %w", def.File, err)
		}
	}
	lock, err := artifact.ReadLock(artifact.LockPath(def))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, nil, nil, err
	}
	if u := artifact.Unpinned(def, prof, lock); len(u) > 0 {
		return nil, nil, nil, fmt.Errorf("refusing to bake unpinned inputs:\n  %s", strings.Join(u, "\n  "))
	}
	return def, prof, lock, nil
}

// applyOverlays applies the profile overlay documents in files to prof, in order. Each entry
// of an overlay must name an artifact or image of some profile in the definition's profiles
// directory (not necessarily this role's), so that a typo fails loudly.
func applyOverlays(def *spec.Definition, prof *spec.Profile, files []string, log *slog.Logger) (*spec.Profile, error) {
	if len(files) == 0 {
		return prof, nil
	}
	all, err := def.Profiles()
	if err != nil {
		return nil, err
	}
	var errs []error
	for _, f := range files {
		ov, err := spec.LoadProfileOverlay(f)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if err := ov.Check(all); err != nil {
			errs = append(errs, err)
			continue
		}
		prof = ov.Apply(prof)
		log.Info("profile overlay", "file", ov.File, "artifacts", len(ov.Artifacts), "images", len(ov.Images))
	}
	return prof, errors.Join(errs...)
}
