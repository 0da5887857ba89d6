// Package install is kiln-init's install mode: a network boot whose kernel command line names
// a disk image (kiln.install.image_url=, kiln.install.image_sha256=) and a target disk
// (kiln.install.dev=) writes the image to the disk and reboots into it, as coreos-installer
// does for Fedora CoreOS. A boot from the iso output installs the same way from its own
// medium: kiln.install.image_url=medium:/kiln/disk.raw.zst reads the image from the ISO 9660
// volume labelled KILN_LIVE (found and mounted as a live boot from the medium finds it), with
// no network, and the disk holding that volume is never a target.
//
// The disk is chosen with care: kiln.install.dev=auto takes the only empty whole disk and
// refuses when there are several or none; a disk holding data (a partition table, a
// filesystem, RAID, LVM or LUKS signatures) is written only with kiln.install.wipe=1; a disk
// the node config names as its etcd volume is never written. The write is ordered so that a
// failed or interrupted install never leaves a disk that boots half-installed: the target's
// partition tables are destroyed first, the image's first MiB (its protective MBR and GPT)
// and last MiB (its backup GPT) are held in memory while the rest is streamed to the disk,
// and they are written only once the whole download matched its sha256 and the image's boot
// entry carries kiln.config.url= when the install was given one (without it the entry is kept
// and the installed node takes its config as a disk boot does, e.g. from a CIDATA volume).
// Stage 1 (initd/stage1) brings the network up and hands over
// to Run.
package install

import (
	"encoding/hex"
	"fmt"
	"net/url"
	"path"
	"slices"
	"strings"

	"github.com/kilnproject/kiln/initd/stage1/liveroot"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

// Kernel parameters, without their "kiln." prefix (stage1.Cmdline.Kiln's keys).
const (
	paramDev       = "install.dev"
	paramImageURL  = "install.image_url"
	paramImageHash = "install.image_sha256"
	paramWipe      = "install.wipe"
	paramConfigURL = "config.url"
)

// auto is the kiln.install.dev= value that lets the installer choose the disk.
const auto = "auto"

// byIDDir is where udev links disks by id; a kiln.install.dev= name may carry it as a prefix.
const byIDDir = "/dev/disk/by-id/"

// params are the install parameters of the kernel command line.
type params struct {
	// dev is a device path (/dev/vda), a /dev/disk/by-id name (with or without its
	// directory), or auto.
	dev string
	// imageURL is the http(s) URL of the raw disk image, or medium:<path> for a file on the
	// boot medium, compressed when its path ends in .zst, .xz, .gz or .bz2.
	imageURL *url.URL
	// mediumFile is the image's path on the boot medium for a medium: URL, "" otherwise.
	mediumFile string
	// sha256 is the lowercase hex sha256 of the bytes the URL serves (the compressed file).
	sha256 string
	// wipe allows writing over a disk that holds data.
	wipe bool
	// configURL is kiln.config.url= as given, its ${…} variables unexpanded; "" when absent.
	configURL string
}

// imageName is the last element of the image URL's path, for messages.
func (p params) imageName() string { return path.Base(p.imageURL.Path) }

// knownParams are the kiln.install.* keys parseParams takes; any other is an error, so a
// misspelt kiln.install.wipe does not silently mean "no".
var knownParams = []string{paramDev, paramImageURL, paramImageHash, paramWipe}

// parseParams reads the install parameters from the kiln.* parameters of the kernel command
// line (keys without "kiln."). Every error names the parameter.
func parseParams(kiln map[string]string) (params, error) {
	for k := range kiln {
		if strings.HasPrefix(k, "install.") && !slices.Contains(knownParams, k) {
			return params{}, fmt.Errorf("kernel cmdline: kiln.%s: unknown install parameter (known: kiln.%s)", k, strings.Join(knownParams, ", kiln."))
		}
	}
	var p params
	var err error
	if p.dev, err = parseDev(kiln[paramDev]); err != nil {
		return params{}, err
	}
	if p.imageURL, p.mediumFile, err = parseImageURL(kiln[paramImageURL]); err != nil {
		return params{}, err
	}
	h := strings.ToLower(kiln[paramImageHash])
	if _, err := hex.DecodeString(h); err != nil || len(h) != 64 {
		return params{}, fmt.Errorf("kernel cmdline: kiln.%s=%q: want the 64 hex digits of the image file's sha256", paramImageHash, kiln[paramImageHash])
	}
	p.sha256 = h
	switch w, ok := kiln[paramWipe]; {
	case !ok || w == "0":
	case w == "1":
		p.wipe = true
	default:
		return params{}, fmt.Errorf("kernel cmdline: kiln.%s=%q: want 1 (write over a disk holding data) or 0", paramWipe, w)
	}
	p.configURL = kiln[paramConfigURL]
	if strings.ContainsAny(p.configURL, " \t\n\"") {
		return params{}, fmt.Errorf("kernel cmdline: kiln.%s=%q: a URL with white space or quotes cannot be handed to the installed disk's boot entry", paramConfigURL, p.configURL)
	}
	return p, nil
}

func parseDev(v string) (string, error) {
	switch {
	case v == "":
		return "", fmt.Errorf("kernel cmdline: kiln.%s= is missing (want /dev/<disk>, a /dev/disk/by-id name, or auto)", paramDev)
	case v == auto:
		return v, nil
	case strings.HasPrefix(v, byIDDir):
		v = strings.TrimPrefix(v, byIDDir)
	case strings.HasPrefix(v, "/dev/"):
		if path.Clean(v) != v {
			return "", fmt.Errorf("kernel cmdline: kiln.%s=%s: not a clean path", paramDev, v)
		}
		return v, nil
	case strings.HasPrefix(v, "/"):
		return "", fmt.Errorf("kernel cmdline: kiln.%s=%s: a device path must be under /dev", paramDev, v)
	}
	if v == "" || strings.ContainsRune(v, '/') || v == "." || v == ".." {
		return "", fmt.Errorf("kernel cmdline: kiln.%s=%s: not a name in %s", paramDev, v, byIDDir)
	}
	return v, nil
}

func parseImageURL(v string) (*url.URL, string, error) {
	if v == "" {
		return nil, "", fmt.Errorf("kernel cmdline: kiln.%s= is missing (want the http(s) URL of the disk image, or %s<path> on the boot medium)", paramImageURL, nodeimage.MediumScheme)
	}
	if file, ok, err := liveroot.MediumPath(v); ok {
		if err != nil {
			return nil, "", fmt.Errorf("kernel cmdline: kiln.%s=%s: %w", paramImageURL, v, err)
		}
		return &url.URL{Scheme: strings.TrimSuffix(nodeimage.MediumScheme, ":"), Path: file}, file, nil
	}
	u, err := url.Parse(v)
	if err != nil {
		return nil, "", fmt.Errorf("kernel cmdline: kiln.%s: %w", paramImageURL, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
		return nil, "", fmt.Errorf("kernel cmdline: kiln.%s=%s: want an http:// or https:// URL with a host, or %s<path> on the boot medium", paramImageURL, u.Redacted(), nodeimage.MediumScheme)
	}
	if p := path.Base(u.Path); p == "/" || p == "." {
		return nil, "", fmt.Errorf("kernel cmdline: kiln.%s=%s: the URL names no file", paramImageURL, u.Redacted())
	}
	return u, "", nil
}
