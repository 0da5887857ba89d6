package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/kilnproject/kiln/builder/output"
	"github.com/kilnproject/kiln/builder/sbom"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

// pxeReport is what inspect found in a pxe directory: each file checked against the metadata.
type pxeReport struct {
	Dir        string            `json:"dir"`
	KernelArgs string            `json:"kernelArgs"`
	Files      []output.PXECheck `json:"files"`
	OK         bool              `json:"ok"`
}

// inspectOutputs shows a bake's <image>-<role>.json, or a pxe directory with the .json beside
// it: the metadata, the outputs with their sha256 and, when the image has a pxe output, its
// files checked against their recorded sha256. A file that does not match fails it.
func inspectOutputs(w io.Writer, arg string, asJSON bool) error {
	mdFile, err := metadataFileOf(arg)
	if err != nil {
		return err
	}
	md, err := readMetadata(mdFile)
	if err != nil {
		return err
	}
	var rep *pxeReport
	var checkErr error
	if md.PXE != nil {
		rep = &pxeReport{Dir: filepath.Join(filepath.Dir(mdFile), md.PXE.Dir), KernelArgs: md.PXE.KernelArgs}
		rep.Files, checkErr = output.CheckPXE(rep.Dir, md.PXE)
		rep.OK = checkErr == nil
	} else if mdFile != arg {
		return fmt.Errorf("%s: %s has no pxe object: the image was baked without the pxe format", arg, mdFile)
	}
	if asJSON {
		if err := writeJSON(w, map[string]any{"metadata": md, "pxe": rep}); err != nil {
			return err
		}
	} else {
		printOutputs(w, mdFile, md, rep)
	}
	return checkErr
}

// metadataFileOf is the metadata file arg names: arg itself (a .json), or for a pxe directory
// <image>-<role>.json beside it.
func metadataFileOf(arg string) (string, error) {
	if strings.HasSuffix(arg, ".json") {
		return arg, nil
	}
	dir := filepath.Clean(arg)
	stem, ok := strings.CutSuffix(filepath.Base(dir), nodeimage.PXEDirSuffix)
	if !ok || stem == "" {
		return "", fmt.Errorf("%s: a directory, but not a pxe output (<image>-<role>%s)", arg, nodeimage.PXEDirSuffix)
	}
	return filepath.Join(filepath.Dir(dir), stem+".json"), nil
}

func readMetadata(file string) (*nodeimage.Metadata, error) {
	data, err := os.ReadFile(file)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%s: the image metadata the bake writes beside its outputs is missing: %w", file, err)
	}
	if err != nil {
		return nil, err
	}
	md := new(nodeimage.Metadata)
	if err := json.Unmarshal(data, md); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	return md, nil
}

// printOutputs writes the metadata's outputs and the pxe check for people to read.
func printOutputs(w io.Writer, mdFile string, md *nodeimage.Metadata, rep *pxeReport) {
	fmt.Fprintf(w, "metadata %s\n", mdFile)
	fmt.Fprintf(w, "image:   %s, role %s, platform %s\n", md.Name, md.Role, md.Platform)
	fmt.Fprintf(w, "kernel:  %s\n", md.Kernel.Version)
	fmt.Fprintf(w, "base:    %s@%s\n", md.Base.Ref, md.Base.Digest)
	if md.Disk != nil {
		fmt.Fprintf(w, "cmdline: %s\n", md.Disk.Cmdline)
	}
	if v := md.Verity; v != nil {
		fmt.Fprintf(w, "verity:  root hash %s (%d data blocks, tree %d KiB at byte %d)\n", v.RootHash, v.DataBlocks, (v.Size-v.HashOffset)>>10, v.HashOffset)
	}
	if s := md.SBOM; s != nil {
		fmt.Fprintf(w, "sbom:    %s (sha256 %s): %s\n", s.File, s.SHA256, sbomCounts(s.Packages))
		if c := s.CycloneDX; c != nil {
			fmt.Fprintf(w, "         %s (sha256 %s)\n", c.File, c.SHA256)
		}
	}
	fmt.Fprintf(w, "\noutputs:\n")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "FORMAT\tFILE\tSIZE\tSHA256")
	for _, o := range md.Outputs {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\n", o.Format, o.File, o.Size, o.SHA256)
	}
	tw.Flush()
	if rep == nil {
		return
	}
	fmt.Fprintf(w, "\npxe %s\nkernel args: %s\n", rep.Dir, rep.KernelArgs)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "FILE\tSIZE\tSHA256\tCHECK")
	for _, c := range rep.Files {
		status := "ok"
		if c.Problem != "" {
			status = "MISMATCH: " + c.Problem
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\n", c.Want.File, c.Want.Size, c.Want.SHA256, status)
	}
	tw.Flush()
}

// sbomCounts says how many packages of each kind an SBOM lists, in sbom.Kinds' order:
// "245 deb, 7 artifact, 3 image, 171 go, 1 kernel".
func sbomCounts(n map[string]int) string {
	var parts []string
	for _, k := range sbom.Kinds {
		if n[k] > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", n[k], k))
		}
	}
	return strings.Join(parts, ", ")
}
