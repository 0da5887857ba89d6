package main

import (
	"crypto"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kilnproject/kiln/builder/output"
	"github.com/kilnproject/kiln/builder/provenance"
)

const verifyLong = `Verify checks a bake's signed provenance (<image>-<role>.intoto.jsonl, written by
kiln bake --sign-key): that its DSSE envelope is signed by --key (a PEM public key, ed25519 or
ECDSA P-256), that every subject it names is there beside it with the sha256 it says, and that
the SBOMs the metadata names (SPDX and CycloneDX) are the signed ones. Given a directory, it
checks every provenance in it; given <image>-<role>.json, that image's. It prints one line
per file and names every failure; it fails when any check fails or no provenance is found.`

const verifyExample = `  openssl genpkey -algorithm ed25519 -out kiln.key && openssl pkey -in kiln.key -pubout -out kiln.pub
  kiln bake images/qemu.yaml --role worker -o out --sign-key kiln.key
  kiln verify out --key kiln.pub
  kiln verify out/qemu-worker.json --key kiln.pub`

func newVerifyCmd() *cobra.Command {
	var key string
	cmd := &cobra.Command{
		Use:     "verify OUTPUT-DIR | IMAGE-ROLE.json --key PUB",
		Short:   "Check a bake's signed provenance and every output it names",
		Long:    verifyLong,
		Example: verifyExample,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			pub, err := provenance.LoadPublicKey(key)
			if err != nil {
				return err
			}
			return verifyOutputs(cmd.OutOrStdout(), args[0], pub)
		},
	}
	cmd.Flags().StringVar(&key, "key", "", "PEM public key (ed25519 or ECDSA P-256) the provenance must be signed with")
	_ = cmd.MarkFlagRequired("key")
	return cmd
}

// verifyOutputs checks the provenances at target (a directory, or one image's metadata file)
// with pub and prints what it checked to w.
func verifyOutputs(w io.Writer, target string, pub crypto.PublicKey) error {
	var envelopes []string
	if strings.HasSuffix(target, ".json") {
		envelopes = []string{strings.TrimSuffix(target, ".json") + provenance.EnvelopeSuffix}
	} else {
		found, err := filepath.Glob(filepath.Join(target, "*"+provenance.EnvelopeSuffix))
		if err != nil {
			return err
		}
		if len(found) == 0 {
			return fmt.Errorf("%s: no *%s (bake with --sign-key)", target, provenance.EnvelopeSuffix)
		}
		envelopes = found
	}
	var failed []string
	for _, env := range envelopes {
		failed = append(failed, verifyOne(w, env, pub)...)
	}
	if len(failed) > 0 {
		return fmt.Errorf("verification failed:\n  %s", strings.Join(failed, "\n  "))
	}
	return nil
}

// verifyOne checks one envelope and the files it names; it returns the failures.
func verifyOne(w io.Writer, env string, pub crypto.PublicKey) []string {
	data, err := os.ReadFile(env)
	if err != nil {
		return []string{err.Error()}
	}
	st, err := provenance.Verify(data, pub)
	if err != nil {
		return []string{fmt.Sprintf("%s: %v", env, err)}
	}
	fmt.Fprintf(w, "%s: signature ok\n", env)
	dir := filepath.Dir(env)
	var failed []string
	var names []string
	for _, s := range st.Subject {
		names = append(names, s.Name)
		p := filepath.Join(dir, filepath.FromSlash(s.Name))
		if !filepath.IsLocal(filepath.FromSlash(s.Name)) {
			failed = append(failed, fmt.Sprintf("%s: subject %q is not a file beside it", env, s.Name))
			continue
		}
		got, _, err := output.HashFile(p)
		switch {
		case err != nil:
			failed = append(failed, fmt.Sprintf("%s: %v", s.Name, err))
		case got != s.Digest["sha256"]:
			failed = append(failed, fmt.Sprintf("%s: sha256 %s, the provenance says %s", s.Name, got, s.Digest["sha256"]))
		default:
			fmt.Fprintf(w, "  %s: sha256 ok\n", s.Name)
		}
	}
	// The SBOM the metadata names is one of the signed subjects, with the same digest.
	mdFile := strings.TrimSuffix(env, provenance.EnvelopeSuffix) + ".json"
	if md, err := readMetadata(mdFile); err != nil {
		failed = append(failed, err.Error())
	} else if md.SBOM == nil {
		failed = append(failed, fmt.Sprintf("%s names no SBOM", mdFile))
	} else {
		for _, f := range md.SBOM.Files() {
			if i := slices.Index(names, f.File); i < 0 || st.Subject[i].Digest["sha256"] != f.SHA256 {
				failed = append(failed, fmt.Sprintf("the SBOM %s (sha256 %s) is not the signed one", f.File, f.SHA256))
			} else {
				fmt.Fprintf(w, "  %s: the signed SBOM\n", f.File)
			}
		}
	}
	if len(failed) == 0 {
		fmt.Fprintf(w, "%s: %d subjects verified\n", env, len(st.Subject))
	}
	return failed
}
