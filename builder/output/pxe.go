package output

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/kilnproject/kiln/internal/nodeimage"
)

// PXEBaseVar is the iPXE variable boot.ipxe takes the pxe directory's URL from, ending in "/".
const PXEBaseVar = "kiln-base"

// PXESource is what the pxe output is made of: the bake's own kernel, initramfs and root
// filesystem image (the files that go on the ESP and into root-a), not the raw disk.
type PXESource struct {
	Kernel, Initrd, RootFS string // host paths
	// KernelArgs are the kernel arguments of a network boot (disk.BootArgs: no root=).
	KernelArgs string
	// Title names the image in the script's comment, "metal worker (6.1.0-28-cloud-amd64)".
	Title string
}

// WritePXE writes the pxe directory dir, which must not exist: the kernel, the initramfs and
// the root filesystem image (hard-linked when they are on dir's filesystem, else copied) and
// a live-boot boot.ipxe, and returns their names, digests and the kernel arguments. The files
// are written into a partial directory renamed to dir at the end: on error dir does not
// exist.
func WritePXE(dir string, src PXESource) (*nodeimage.PXEInfo, error) {
	if err := checkIPXEText(src.KernelArgs, src.Title); err != nil {
		return nil, fmt.Errorf("pxe: %w", err)
	}
	if _, err := os.Lstat(dir); err == nil {
		return nil, fmt.Errorf("pxe: %s exists already", dir)
	}
	tmp := dir + ".partial"
	if err := os.RemoveAll(tmp); err != nil {
		return nil, fmt.Errorf("pxe: remove stale %s: %w", tmp, err)
	}
	info, err := writePXEFiles(tmp, src)
	if err == nil {
		err = os.Rename(tmp, dir)
	}
	if err != nil {
		os.RemoveAll(tmp)
		return nil, fmt.Errorf("pxe %s: %w", filepath.Base(dir), err)
	}
	info.Dir = filepath.Base(dir)
	return info, nil
}

// writePXEFiles fills the directory tmp and records what it wrote.
func writePXEFiles(tmp string, src PXESource) (*nodeimage.PXEInfo, error) {
	if err := os.Mkdir(tmp, 0o755); err != nil {
		return nil, err
	}
	info := &nodeimage.PXEInfo{KernelArgs: src.KernelArgs}
	for _, f := range []struct {
		dst  *nodeimage.PXEFile
		name string
		src  string
	}{
		{&info.Kernel, nodeimage.PXEKernelName, src.Kernel},
		{&info.Initrd, nodeimage.PXEInitrdName, src.Initrd},
		{&info.RootFS, nodeimage.PXERootFSName, src.RootFS},
	} {
		p := filepath.Join(tmp, f.name)
		if err := linkOrCopy(f.src, p); err != nil {
			return nil, err
		}
		pf, err := describe(p, f.name)
		if err != nil {
			return nil, err
		}
		*f.dst = pf
	}
	script := filepath.Join(tmp, nodeimage.PXEScriptName)
	text := PXEScript(strings.TrimSuffix(filepath.Base(tmp), ".partial"), src.Title, src.KernelArgs, info.RootFS.SHA256)
	if err := os.WriteFile(script, []byte(text), 0o644); err != nil {
		return nil, err
	}
	pf, err := describe(script, nodeimage.PXEScriptName)
	if err != nil {
		return nil, err
	}
	info.Script = pf
	return info, nil
}

// checkIPXEText refuses what would change meaning in an iPXE script: iPXE expands ${…} on
// every line, and a line break would end the kernel line.
func checkIPXEText(kernelArgs, title string) error {
	for _, arg := range strings.Fields(kernelArgs) {
		if strings.Contains(arg, "${") {
			return fmt.Errorf("kernel argument %q: iPXE would expand ${…} in it", arg)
		}
	}
	if strings.ContainsAny(kernelArgs+title, "\r\n") {
		return errors.New("kernel arguments and title must be one line")
	}
	return nil
}

// PXEScript is boot.ipxe of the pxe directory named dir: it boots the image live from the
// directory whose URL is in ${kiln-base}, the root filesystem image checked against
// rootfsSHA256 by stage 1.
func PXEScript(dir, title, kernelArgs, rootfsSHA256 string) string {
	base := "${" + PXEBaseVar + "}"
	return "#!ipxe\n" +
		"# kiln " + title + ": boot it live from the network (the root filesystem in RAM).\n" +
		"# Serve this directory over HTTP and chain this script with " + PXEBaseVar + " set to the\n" +
		"# directory's URL, ending in a slash:\n" +
		"#   set " + PXEBaseVar + " http://192.0.2.1:8080/" + dir + "/\n" +
		"#   chain ${" + PXEBaseVar + "}" + nodeimage.PXEScriptName + "\n" +
		"# Add kiln.config.url=<URL> to the kernel line to give the node its config;\n" +
		"# `kiln serve` renders such a script for each machine.\n" +
		"isset " + base + " || goto no_base\n" +
		"kernel " + base + nodeimage.PXEKernelName + " initrd=" + nodeimage.PXEInitrdName + " " + kernelArgs +
		" kiln.live.rootfs_url=" + base + nodeimage.PXERootFSName + " kiln.live.rootfs_sha256=" + rootfsSHA256 + "\n" +
		"initrd " + base + nodeimage.PXEInitrdName + "\n" +
		"boot\n" +
		":no_base\n" +
		"echo kiln: set " + PXEBaseVar + " to the URL of this directory (ending in /) before chaining " + nodeimage.PXEScriptName + "\n" +
		"exit 1\n"
}

// linkOrCopy makes dst the same content as the regular file src: a hard link, or a copy when
// they are on different filesystems.
func linkOrCopy(src, dst string) error {
	fi, err := os.Stat(src)
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file", src)
	}
	if fi.Size() == 0 {
		return fmt.Errorf("%s is empty", src)
	}
	if os.Link(src, dst) == nil {
		return nil
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	_, err = io.Copy(out, in)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("copy %s: %w", src, err)
	}
	return nil
}

// describe is the name, digest and size of the file p.
func describe(p, name string) (nodeimage.PXEFile, error) {
	sum, size, err := HashFile(p)
	if err != nil {
		return nodeimage.PXEFile{}, err
	}
	return nodeimage.PXEFile{File: name, SHA256: sum, Size: size}, nil
}

// PXECheck is one file of a pxe directory compared with what the metadata records.
type PXECheck struct {
	Want nodeimage.PXEFile `json:"want"`
	// Path is the file on this host; SHA256 and Size what it holds now.
	Path   string `json:"path"`
	SHA256 string `json:"sha256,omitempty"`
	Size   int64  `json:"size"`
	// Problem says how the file differs from Want; empty when it matches.
	Problem string `json:"problem,omitempty"`
}

// CheckPXE hashes the files of the pxe directory dir and compares each with info. It returns
// one check per file, in the order of info.Files, and an error naming every file that does
// not match.
func CheckPXE(dir string, info *nodeimage.PXEInfo) ([]PXECheck, error) {
	var checks []PXECheck
	var bad []string
	for _, want := range info.Files() {
		c := checkPXEFile(dir, want)
		if c.Problem != "" {
			bad = append(bad, c.Problem)
		}
		checks = append(checks, c)
	}
	if len(bad) > 0 {
		return checks, fmt.Errorf("pxe %s does not match its metadata: %s", dir, strings.Join(bad, "; "))
	}
	return checks, nil
}

func checkPXEFile(dir string, want nodeimage.PXEFile) PXECheck {
	c := PXECheck{Want: want, Path: filepath.Join(dir, want.File)}
	if want.File == "" || want.File != filepath.Base(want.File) || want.File == "." || want.File == ".." {
		c.Problem = fmt.Sprintf("recorded file name %q is not a name inside the directory", want.File)
		return c
	}
	sum, size, err := HashFile(c.Path)
	if err != nil {
		c.Problem = fmt.Sprintf("%s: %v", want.File, err)
		return c
	}
	c.SHA256, c.Size = sum, size
	switch {
	case size != want.Size:
		c.Problem = fmt.Sprintf("%s is %d bytes, the metadata says %d", want.File, size, want.Size)
	case sum != want.SHA256:
		c.Problem = fmt.Sprintf("%s has sha256 %s, the metadata says %s", want.File, sum, want.SHA256)
	}
	return c
}
