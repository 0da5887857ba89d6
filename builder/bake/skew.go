package bake

import (
	"context"
	"debug/buildinfo"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"regexp"
	"strconv"
	"strings"

	"github.com/kilnproject/kiln/builder/spec"
	"github.com/kilnproject/kiln/initd/rootpath"
)

// binDirs are searched for the runtime binaries, in the order of systemd's default PATH.
var binDirs = []string{"usr/local/sbin", "usr/local/bin", "usr/sbin", "usr/bin"}

// binaryVersion is a program found in a root tree and the version its Go build information records.
type binaryVersion struct {
	Path    string // absolute path in the image, "/usr/bin/kubelet"
	Version string // normalised "v1.37.2" (build metadata such as "+unknown" dropped); "" if not recorded
	Source  string // where Version was read: "-X k8s.io/component-base/version.gitVersion=v1.37.2" or "module k8s.io/kubernetes v1.37.2"
}

// treeVersions are the runtime binaries found in a root tree; nil means absent.
type treeVersions struct {
	Kubelet, Kubectl, Containerd, Runc, Dockerd, CRIDockerd *binaryVersion
}

// versionSources says where each program's Go build information records its version: the
// -ldflags "-X" variables its release builds set, then its main module. need is true for the
// programs whose version checkVersions compares; the others only have to be present.
var versionSources = []struct {
	name    string
	vars    []string // -X variables, matched as the end of the variable's import path
	modules []string // module paths whose tagged version is the program's
	need    bool
	set     func(v *treeVersions, b *binaryVersion)
}{
	{"kubelet", kubeVars, []string{"k8s.io/kubernetes"}, true, func(v *treeVersions, b *binaryVersion) { v.Kubelet = b }},
	{"kubectl", kubeVars, []string{"k8s.io/kubernetes"}, true, func(v *treeVersions, b *binaryVersion) { v.Kubectl = b }},
	{"containerd", []string{"github.com/containerd/containerd/v2/version.Version", "github.com/containerd/containerd/version.Version"},
		[]string{"github.com/containerd/containerd/v2", "github.com/containerd/containerd"}, true, func(v *treeVersions, b *binaryVersion) { v.Containerd = b }},
	{"runc", []string{"main.version"}, []string{"github.com/opencontainers/runc"}, false, func(v *treeVersions, b *binaryVersion) { v.Runc = b }},
	{"dockerd", []string{"github.com/docker/docker/dockerversion.Version", "github.com/moby/moby/v2/dockerversion.Version"},
		[]string{"github.com/docker/docker", "github.com/moby/moby/v2"}, false, func(v *treeVersions, b *binaryVersion) { v.Dockerd = b }},
	{"cri-dockerd", []string{"github.com/Mirantis/cri-dockerd/cmd/version.Version"}, []string{"github.com/Mirantis/cri-dockerd"}, false,
		func(v *treeVersions, b *binaryVersion) { v.CRIDockerd = b }},
}

// kubeVars are the variables Kubernetes' build sets to the release (hack/lib/version.sh),
// also under a vendor/ prefix in older releases.
var kubeVars = []string{"k8s.io/component-base/version.gitVersion", "k8s.io/client-go/pkg/version.gitVersion", "k8s.io/kubernetes/pkg/version.gitVersion"}

// readVersions finds kubelet, kubectl, containerd, runc, dockerd and cri-dockerd in the tree at
// root (in /usr/local/sbin, /usr/local/bin, /usr/sbin or /usr/bin, symlinks resolved inside the
// tree) and reads each present one's version from its Go build information, opened inside the
// tree: nothing from the tree runs on the host. kubelet, kubectl and containerd must record
// their version (an -ldflags -X of the release's version variable, or a tagged module
// version); runc, dockerd and cri-dockerd need only be present and executable.
func readVersions(ctx context.Context, root string) (treeVersions, error) {
	var v treeVersions
	r, err := os.OpenRoot(root)
	if err != nil {
		return v, fmt.Errorf("versions: %w", err)
	}
	defer r.Close()
	var errs []error
	for _, p := range versionSources {
		if err := ctx.Err(); err != nil {
			return v, err
		}
		rel, resolved, err := findBinary(r, p.name)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if rel == "" {
			continue
		}
		b, err := readVersion(r, resolved, p.vars, p.modules)
		if err != nil && p.need {
			errs = append(errs, fmt.Errorf("/%s: %w", rel, err))
			continue
		}
		if b == nil {
			b = &binaryVersion{}
		}
		b.Path = "/" + rel
		p.set(&v, b)
	}
	return v, errors.Join(errs...)
}

// findBinary returns where name is in the tree (rel, "" if nowhere) and that path with its
// symlinks resolved inside the tree (resolved, for opening it through the tree's root).
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

// releaseRE is a module version naming a release or a pre-release; pseudoRE is the tail of a
// pseudo-version ("-0.20260101120000-abcdef123456"), which names a commit, not a release.
var (
	releaseRE = regexp.MustCompile(`^v\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$`)
	pseudoRE  = regexp.MustCompile(`[-.]\d{14}-[0-9a-f]{12}(\+[0-9A-Za-z.-]+)?$`)
)

// readVersion reads the version of the executable at p in r from its Go build information,
// through the file opened inside the tree: first the last -ldflags -X of the first of vars it
// sets, then the main module's version if the main module is one of modules and the version
// names a release. The binary is never run.
func readVersion(r *os.Root, p string, vars, modules []string) (*binaryVersion, error) {
	f, err := r.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("not a regular file")
	}
	bi, err := buildinfo.Read(f)
	if err != nil {
		return nil, fmt.Errorf("cannot read its version: it has no Go build information (%v), and kiln does not run binaries from the image", err)
	}
	var ldflags string
	for _, s := range bi.Settings {
		if s.Key == "-ldflags" {
			ldflags = s.Value
		}
	}
	xs := ldflagsX(ldflags)
	for _, want := range vars {
		for i := len(xs) - 1; i >= 0; i-- {
			name, val, _ := strings.Cut(xs[i], "=")
			if name != want && !strings.HasSuffix(name, "/vendor/"+want) {
				continue
			}
			m := versionRE.FindStringSubmatch(val)
			if m == nil {
				return nil, fmt.Errorf("its build information sets -X %s=%q, which is not a version", name, val)
			}
			return &binaryVersion{Version: "v" + m[1] + "." + m[2] + "." + m[3] + m[4], Source: "-X " + xs[i]}, nil
		}
	}
	mv := bi.Main.Version
	for _, mod := range modules {
		if bi.Main.Path == mod && releaseRE.MatchString(mv) && !pseudoRE.MatchString(mv) {
			m := versionRE.FindStringSubmatch(mv)
			return &binaryVersion{Version: "v" + m[1] + "." + m[2] + "." + m[3] + m[4], Source: "module " + mod + " " + mv}, nil
		}
	}
	ld := "no -ldflags recorded"
	if ldflags != "" {
		ld = "-ldflags without -X " + vars[0]
	}
	main := bi.Main.Path + " " + mv
	if bi.Main.Path == "" {
		main = "none"
	}
	return nil, fmt.Errorf("its Go build information records no release version (main module %s, %s), and kiln does not run binaries from the image to ask them: "+
		"build it from a release tag of %s, or with -ldflags \"-X %s=<version>\" and without -trimpath (which leaves -ldflags out of the build information)",
		main, ld, modules[0], vars[0])
}

// ldflagsX returns the name=value arguments of the -X flags in a recorded -ldflags value, in
// order. Fields are split as the go command splits them: at spaces, with '…' or "…" quoting a
// whole field.
func ldflagsX(ldflags string) []string {
	var fields []string
	for s := strings.TrimLeft(ldflags, " \t\n\r"); s != ""; s = strings.TrimLeft(s, " \t\n\r") {
		if q := s[0]; q == '\'' || q == '"' {
			if end := strings.IndexByte(s[1:], q); end >= 0 {
				fields = append(fields, s[1:1+end])
				s = s[2+end:]
				continue
			}
		}
		end := strings.IndexAny(s, " \t\n\r")
		if end < 0 {
			end = len(s)
		}
		fields = append(fields, s[:end])
		s = s[end:]
	}
	var xs []string
	for i := 0; i < len(fields); i++ {
		flag := strings.TrimPrefix(strings.TrimPrefix(fields[i], "-"), "-")
		switch {
		case flag == "X" && i+1 < len(fields) && fields[i] != flag:
			i++
			xs = append(xs, fields[i])
		case strings.HasPrefix(flag, "X=") && fields[i] != flag:
			xs = append(xs, flag[2:])
		}
	}
	return xs
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

// checkVersions refuses a tree whose binaries do not fit k: kubelet must report exactly
// k.Version; kubectl, if present, must be within one minor release of it; with the containerd
// runtime, containerd and runc must be present and containerd new enough for the release
// (containerdMinimum); with the docker runtime, runc, containerd, Docker Engine 29 or newer and
// a cri-dockerd that speaks kubelet's CRI (checkDocker).
func checkVersions(k spec.Kubernetes, v treeVersions) error {
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
		fail("%s reports %s (%s) but kubernetes.version is %s", v.Kubelet.Path, v.Kubelet.Version, v.Kubelet.Source, k.Version)
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
		checkDocker(want, v, fail)
	default:
		if v.Containerd == nil {
			fail("containerd is missing: kubernetes.runtime %s needs it", k.Runtime)
			break
		}
		cv, ok := parseSemver(v.Containerd.Version)
		if !ok {
			fail("%s: cannot read a version from %q", v.Containerd.Path, v.Containerd.Source)
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

// Docker's skew rules: Engine 29 is the first to keep its images in containerd by default
// (the containerd image store, where the bake lays them: overlays/docker configures no graph
// driver), and moby's v2 module begins with it; cri-dockerd 0.3.0 is the first to serve CRI v1,
// the only CRI kubelet speaks since Kubernetes 1.26.
const (
	dockerMinMajor       = 29
	dockerV2Module       = "github.com/moby/moby/v2"
	criDockerdCRIv1      = "v0.3.0"
	criDockerdCRIv1Since = 26
)

// checkDocker checks the binaries of a tree baked for kubernetes.runtime docker against the
// Kubernetes release want: dockerd (Engine 29 or newer), cri-dockerd (CRI v1 where kubelet
// needs it) and the containerd Docker Engine runs on.
func checkDocker(want semver, v treeVersions, fail func(string, ...any)) {
	switch d := v.Dockerd; {
	case d == nil:
		fail("dockerd is missing: kubernetes.runtime docker needs Docker Engine in the image")
	case d.Version == "":
		fail("%s: cannot read Docker Engine's version (no -X …/dockerversion.Version, no module version); kubernetes.runtime docker needs Engine %d or newer", d.Path, dockerMinMajor)
	case !strings.Contains(d.Source, dockerV2Module):
		if dv, ok := parseSemver(d.Version); !ok || dv.major < dockerMinMajor {
			fail("%s is Docker Engine %s; kubernetes.runtime docker needs Engine %d or newer, whose images live in containerd (where the bake lays them)", d.Path, d.Version, dockerMinMajor)
		}
	}
	switch c := v.CRIDockerd; {
	case c == nil:
		fail("cri-dockerd is missing: kubernetes.runtime docker needs it (kubelet has no dockershim since 1.24)")
	case want.major == 1 && want.minor >= criDockerdCRIv1Since:
		cv, ok := parseSemver(c.Version)
		min, _ := parseSemver(criDockerdCRIv1)
		if !ok || cv.less(min) {
			fail("%s is cri-dockerd %q; Kubernetes 1.%d and newer speak CRI v1 only, which cri-dockerd serves since %s", c.Path, c.Version, criDockerdCRIv1Since, criDockerdCRIv1)
		}
	}
	if v.Containerd == nil {
		fail("containerd is missing: kubernetes.runtime docker runs Docker Engine on the node's containerd")
	}
}

// cgroupV2Since is the first Kubernetes minor whose kubelet refuses cgroup v1.
const cgroupV2Since = 35

// checkKernelArgs refuses kernel arguments that force cgroup v1 (or the hybrid hierarchy) when
// k's kubelet needs cgroup v2: systemd.unified_cgroup_hierarchy=0 and
// systemd.legacy_systemd_cgroup_controller. cgroup_no_v1= is fine (it only disables v1).
func checkKernelArgs(k spec.Kubernetes, args []string) error {
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
