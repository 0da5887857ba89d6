package spec

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// CacheDir returns kiln's cache directory: $KILN_CACHE if set, else
// $XDG_CACHE_HOME/kiln, else ~/.cache/kiln. It is also the value of
// ${KILN_CACHE} in documents when that variable is not set.
func CacheDir() (string, error) {
	if d := os.Getenv("KILN_CACHE"); d != "" {
		return filepath.Abs(d)
	}
	if d := os.Getenv("XDG_CACHE_HOME"); d != "" {
		return filepath.Join(d, "kiln"), nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("cache directory: set KILN_CACHE: %w", err)
	}
	return filepath.Join(home, ".cache", "kiln"), nil
}

// expandPath replaces $VAR and ${VAR} in s with the environment and makes
// the result absolute relative to dir. An unset variable is an error, except
// KILN_CACHE, which defaults to CacheDir.
func expandPath(s, dir string) (string, error) {
	var errs []error
	out := os.Expand(s, func(name string) string {
		if v, ok := os.LookupEnv(name); ok && v != "" {
			return v
		}
		if name == "KILN_CACHE" {
			d, err := CacheDir()
			if err != nil {
				errs = append(errs, err)
			}
			return d
		}
		errs = append(errs, fmt.Errorf("environment variable %s is not set", name))
		return ""
	})
	if len(errs) > 0 {
		return "", errors.Join(errs...)
	}
	if strings.TrimSpace(out) == "" {
		return "", errors.New("empty path")
	}
	if !filepath.IsAbs(out) {
		out = filepath.Join(dir, out)
	}
	return filepath.Clean(out), nil
}
