package bake

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/kilnproject/kiln/builder/spec"
	"github.com/kilnproject/kiln/initd/rootpath"
)

// VersionTimeout bounds each `<binary> --version` run at bake time.
const VersionTimeout = 10 * time.Second

// binDirs are searched for the runtime binaries, in the order of systemd's default PATH.
var binDirs = []string{"usr/local/sbin", "usr/local/bin", "usr/sbin", "usr/bin"}

// Binary is a program found in a root tree and the version it reports.
type Binary struct {
	Path    string // absolute path in the image, "/usr/bin/kubelet"
	Version string // normalised "v1.37.2" (build metadata such as "+unknown" dropped)
	Output  string // what it printed, first line
}

// Versions are the runtime binaries found in a root tree; nil means absent.
type Versions struct {
	Kubelet, Kubectl, Containerd, Runc, Dockerd, CRIDockerd *Binary
}

// versionArgs are the arguments that make each program print its version.
var versionArgs = []struct {
	name string
	args []string
	set  func(v *Versions, b *Binary)
}{
	{"kubelet", []string{"--version"}, func(v *Versions, b *Binary) { v.Kubelet = b }},
	{"kubectl", []string{"version", "--client"}, func(v *Versions, b *Binary) { v.Kubectl = b }},
	{"containerd", []string{"--version"}, func(v *Versions, b *Binary) { v.Containerd = b }},
	{"runc", []string{"--version"}, func(v *Versions, b *Binary) { v.Runc = b }},
	{"dockerd", []string{"--version"}, func(v *Versions, b *Binary) { v.Dockerd = b }},
	{"cri-dockerd", []string{"--version"}, func(v *Versions, b *Binary) { v.CRIDockerd = b }},
}

// ReadVersions finds kubelet, kubectl, containerd, runc, dockerd and cri-dockerd in the tree at
// root (in /usr/local/sbin, /usr/local/bin, /usr/sbin or /usr/bin, symlinks resolved inside the
// tree) and runs each present one on the host to ask its version, each bounded by
// VersionTimeout. A binary that is present but does not run or prints no version is an error.
func ReadVersions(ctx context.Context, root string) (Versions, error) {
	return readVersions(ctx, root, VersionTimeout)
}

func readVersions(ctx context.Context, root string, timeout time.Duration) (Versions, error) {
	var v Versions
	// The binaries run with another working directory: a relative root (kiln bake -o out)
	// must not be resolved against it.
	root, err := filepath.Abs(root)
	if err != nil {
		return v, err
	}
	r, err := os.OpenRoot(root)
	if err != nil {
		return v, fmt.Errorf("versions: %w", err)
	}
	defer r.Close()
	var errs []error
	for _, p := range versionArgs {
		rel, resolved, err := findBinary(r, p.name)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if rel == "" {
			continue
		}
		b, err := runVersion(ctx, filepath.Join(root, filepath.FromSlash(resolved)), p.args, timeout)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", "/"+rel, err))
			continue
		}
		b.Path = "/" + rel
		p.set(&v, b)
	}
	return v, errors.Join(errs...)
}

// findBinary returns where name is in the tree (rel, "" if nowhere) and that path with its
// symlinks resolved inside the tree (resolved, for running it from the host).
func findBinary(r *os.Root, name string) (rel, resolved string, err error) {
	for _, d := range binDirs {
		p, err := rootpath.Resolve(r, path.Join(d, name), nil)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return "", "", fmt.Errorf("/%s/%s: %w", d, name, err)
		}
		fi, err := r.Stat(p)
		if err != nil || !fi.Mode().IsRegular() {
			continue
		}
		if fi.Mode().Perm()&0o111 == 0 {
			return "", "", fmt.Errorf("/%s/%s is not executable (mode %v)", d, name, fi.Mode().Perm())
		}
		return path.Join(d, name), p, nil
	}
	return "", "", nil
}

var versionRE = regexp.MustCompile(`(?:^|[\s:])v?(\d+)\.(\d+)\.(\d+)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?`)

func runVersion(ctx context.Context, host string, args []string, timeout time.Duration) (*Binary, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, host, args...)
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/nonexistent", "LANG=C"}
	cmd.Dir = os.TempDir()
	cmd.WaitDelay = time.Second
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	first, _, _ := strings.Cut(strings.TrimSpace(out.String()), "\n")
	if ctx.Err() == context.DeadlineExceeded {
		return nil, fmt.Errorf("%s did not finish within %s", strings.Join(args, " "), timeout)
	}
	if err != nil {
		return nil, fmt.Errorf("cannot run it on this host (%s): %w %s", strings.Join(args, " "), err, first)
	}
	m := versionRE.FindStringSubmatch(out.String())
	if m == nil {
		return nil, fmt.Errorf("%s printed no version: %q", strings.Join(args, " "), first)
	}
	return &Binary{Version: "v" + m[1] + "." + m[2] + "." + m[3] + m[4], Output: first}, nil
}

type semver struct{ major, minor, patch int }

func parseSemver(s string) (semver, bool) {
	m := versionRE.FindStringSubmatch(s)
	if m == nil {
		return semver{}, false
	}
	a, _ := strconv.Atoi(m[1])
	b, _ := strconv.Atoi(m[2])
	c, _ := strconv.Atoi(m[3])
	return semver{a, b, c}, true
}

func (v semver) less(o semver) bool {
	if v.major != o.major {
		return v.major < o.major
	}
	if v.minor != o.minor {
		return v.minor < o.minor
	}
	return v.patch < o.patch
}

// containerdMinimum is the oldest containerd each Kubernetes minor supports, newest first:
// Kubernetes 1.36 needs containerd 2.2, 1.35 needs 1.7.28. Older releases are not checked.
var containerdMinimum = []struct {
	minor int
	min   string
}{
	{36, "v2.2.0"},
	{35, "v1.7.28"},
}

// CheckVersions refuses a tree whose binaries do not fit k: kubelet must report exactly
// k.Version; kubectl, if present, must be within one minor release of it; with the containerd
// runtime, containerd and runc must be present and containerd new enough for the release
// (containerdMinimum); with the docker runtime, dockerd, cri-dockerd and runc must be present
// (containerd, if any, is Docker's and kubelet does not talk to it).
func CheckVersions(k spec.Kubernetes, v Versions) error {
	want, ok := parseSemver(k.Version)
	if !ok {
		return fmt.Errorf("kubernetes.version %q is not a release", k.Version)
	}
	var errs []error
	fail := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	switch {
	case v.Kubelet == nil:
		fail("kubelet is missing: no kubelet in /usr/local/sbin, /usr/local/bin, /usr/sbin or /usr/bin (add it as an artifact)")
	case v.Kubelet.Version != k.Version:
		fail("%s reports %s (%q) but kubernetes.version is %s", v.Kubelet.Path, v.Kubelet.Version, v.Kubelet.Output, k.Version)
	}
	if v.Kubectl != nil {
		if kv, ok := parseSemver(v.Kubectl.Version); !ok || kv.major != want.major || kv.minor > want.minor+1 || kv.minor+1 < want.minor {
			fail("%s is %s, more than one minor release away from kubernetes.version %s", v.Kubectl.Path, v.Kubectl.Version, k.Version)
		}
	}
	if v.Runc == nil {
		fail("runc is missing: the %s runtime needs it to start containers", k.Runtime)
	}
	switch k.Runtime {
	case "docker":
		if v.Dockerd == nil {
			fail("dockerd is missing: kubernetes.runtime docker needs Docker Engine in the image")
		}
		if v.CRIDockerd == nil {
			fail("cri-dockerd is missing: kubernetes.runtime docker needs it (kubelet has no dockershim since 1.24)")
		}
	default:
		if v.Containerd == nil {
			fail("containerd is missing: kubernetes.runtime %s needs it", k.Runtime)
			break
		}
		cv, ok := parseSemver(v.Containerd.Version)
		if !ok {
			fail("%s: cannot read a version from %q", v.Containerd.Path, v.Containerd.Output)
			break
		}
		for _, m := range containerdMinimum {
			if want.major == 1 && want.minor >= m.minor {
				if min, _ := parseSemver(m.min); cv.less(min) {
					fail("%s is %s; Kubernetes %s needs containerd %s or newer", v.Containerd.Path, v.Containerd.Version, k.Version, m.min)
				}
				break
			}
		}
	}
	return errors.Join(errs...)
}

// cgroupV2Since is the first Kubernetes minor whose kubelet refuses cgroup v1.
const cgroupV2Since = 35

// CheckKernelArgs refuses kernel arguments that force cgroup v1 (or the hybrid hierarchy) when
// k's kubelet needs cgroup v2: systemd.unified_cgroup_hierarchy=0 and
// systemd.legacy_systemd_cgroup_controller. cgroup_no_v1= is fine (it only disables v1).
func CheckKernelArgs(k spec.Kubernetes, args []string) error {
	v, ok := parseSemver(k.Version)
	if !ok || v.major != 1 || v.minor < cgroupV2Since {
		return nil
	}
	var errs []error
	for _, a := range args {
		key, val, hasVal := strings.Cut(a, "=")
		var forcesV1 bool
		switch key {
		case "systemd.unified_cgroup_hierarchy":
			forcesV1 = hasVal && isFalse(val)
		case "systemd.legacy_systemd_cgroup_controller":
			forcesV1 = !hasVal || !isFalse(val)
		}
		if forcesV1 {
			errs = append(errs, fmt.Errorf("kernel.args: %q forces cgroup v1, and kubelet %s refuses cgroup v1 (since Kubernetes 1.%d): remove it", a, k.Version, cgroupV2Since))
		}
	}
	return errors.Join(errs...)
}

// isFalse is systemd's reading of a false boolean.
func isFalse(s string) bool {
	switch strings.ToLower(s) {
	case "0", "no", "n", "false", "f", "off":
		return true
	}
	return false
}

// runtimeUnits are the units the bake enables for each kubernetes.runtime.
var runtimeUnits = map[string][]string{
	"containerd": {"containerd.service"},
	"docker":     {"docker.service", "cri-docker.service"},
}
