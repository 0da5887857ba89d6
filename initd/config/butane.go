package config

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	butane "github.com/coreos/butane/config"
	"github.com/coreos/butane/config/common"
	"github.com/coreos/go-semver/semver"
	"github.com/coreos/vcontext/report"
	"gopkg.in/yaml.v3"
)

// Butane variants and the newest stable version of each that kiln accepts (from 1.0.0):
// fcos up to 1.7.0, whose output is Ignition 3.6, and flatcar up to 1.1.0 (Ignition 3.4).
// Experimental versions are refused: their schema changes between Butane releases. Other
// variants add platform features (OpenShift MachineConfigs, r4e, fiot) that mean nothing
// on a kiln node.
var butaneVariants = []butaneVariant{
	{"fcos", "1.7.0"},
	{"flatcar", "1.1.0"},
}

// butaneVariant is a Butane variant and the newest of its versions kiln accepts.
type butaneVariant struct{ name, max string }

// Ignition spec versions kiln accepts as JSON.
const (
	ignitionMinVersion = "3.0.0"
	ignitionMaxVersion = "3.6.0"
)

// acceptedConfigs says what kiln takes, for errors about a config it does not.
func acceptedConfigs() string {
	var vs []string
	for _, v := range butaneVariants {
		vs = append(vs, fmt.Sprintf("variant: %s with version: 1.0.0 to %s", v.name, v.max))
	}
	return fmt.Sprintf("kiln takes Ignition JSON (spec %s to %s) or Butane YAML (%s)",
		ignitionMinVersion, ignitionMaxVersion, strings.Join(vs, ", or "))
}

// Options are what translating a Butane document may use beyond the document itself.
type Options struct {
	// FilesDir is the directory the Butane `local` keys (contents.local,
	// ssh_authorized_keys_local, trees) are relative to, as `butane -d`; files outside it
	// are refused. Empty: `local` keys are refused (a node has no files directory).
	FilesDir string
}

// TranslateButane translates a Butane YAML document (variant fcos 1.0.0 to 1.7.0, or
// flatcar 1.0.0 to 1.1.0) to Ignition JSON. Errors name the YAML path with line and
// column; an unknown key is an error. Butane's warnings are dropped: Parse keeps them
// (Parse accepts Butane directly).
func TranslateButane(yml []byte) ([]byte, error) {
	return TranslateButaneWith(yml, Options{})
}

// TranslateButaneWith is TranslateButane with Options (a files directory for `local`).
func TranslateButaneWith(yml []byte, o Options) ([]byte, error) {
	out, _, err := translateButane(yml, o)
	return out, err
}

func translateButane(yml []byte, o Options) ([]byte, []string, error) {
	if err := checkButaneVersion(yml); err != nil {
		return nil, nil, err
	}
	if err := checkButaneSugar(yml); err != nil {
		return nil, nil, err
	}
	out, rpt, err := butane.TranslateBytes(yml, common.TranslateBytesOptions{TranslateOptions: common.TranslateOptions{FilesDir: o.FilesDir}})
	strict(&rpt)
	if msg := reportErrors(rpt); msg != "" {
		return nil, nil, fmt.Errorf("butane: %s", msg)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("butane: %w", err)
	}
	return out, reportLines(rpt, report.Warn), nil
}

// checkButaneVersion reads variant and version before translating, so that a document
// of another kind gets an error that says what kiln takes.
func checkButaneVersion(yml []byte) error {
	var head struct {
		Variant string `yaml:"variant"`
		Version string `yaml:"version"`
	}
	if err := yaml.Unmarshal(yml, &head); err != nil {
		msg := strings.TrimPrefix(err.Error(), "yaml: ")
		if strings.HasPrefix(strings.TrimSpace(string(yml)), "#cloud-config") {
			return errors.New("cloud-config user data is not supported: kiln takes Ignition JSON or Butane YAML")
		}
		return fmt.Errorf("neither Ignition JSON nor Butane YAML: %s", msg)
	}
	want := acceptedConfigs()
	switch {
	case head.Variant == "" && strings.HasPrefix(strings.TrimSpace(string(yml)), "#cloud-config"):
		return errors.New("cloud-config user data is not supported: " + want)
	case head.Variant == "":
		return errors.New("butane: variant is not set; " + want)
	}
	i := slices.IndexFunc(butaneVariants, func(v butaneVariant) bool { return v.name == head.Variant })
	if i < 0 {
		return fmt.Errorf("butane: variant %q is not supported; %s", head.Variant, want)
	}
	newest := butaneVariants[i].max
	v, err := semver.NewVersion(head.Version)
	if err != nil {
		return fmt.Errorf("butane: version %q is not a version like %s; %s", head.Version, newest, want)
	}
	if v.PreRelease != "" || v.Major != 1 || semver.New(newest).LessThan(*v) {
		return fmt.Errorf("butane: version %s of variant %s is not supported (1.0.0 to %s); %s", head.Version, head.Variant, newest, want)
	}
	return nil
}

// checkIgnitionVersion reads ignition.version of an Ignition JSON document before it is
// parsed, so that a spec kiln does not take is named with the range it does. A document
// whose version cannot be read is left to the parser, whose error has the line.
func checkIgnitionVersion(js []byte) error {
	var head struct {
		Ignition struct {
			Version string `json:"version"`
		} `json:"ignition"`
	}
	if json.Unmarshal(js, &head) != nil || head.Ignition.Version == "" {
		return nil
	}
	v, err := semver.NewVersion(head.Ignition.Version)
	if err != nil {
		return fmt.Errorf("ignition.version %q is not a version like %s; %s", head.Ignition.Version, ignitionMaxVersion, acceptedConfigs())
	}
	if v.PreRelease != "" || v.LessThan(*semver.New(ignitionMinVersion)) || semver.New(ignitionMaxVersion).LessThan(*v) {
		return fmt.Errorf("ignition.version %s is not supported (%s to %s); %s", head.Ignition.Version, ignitionMinVersion, ignitionMaxVersion, acceptedConfigs())
	}
	return nil
}

// butaneSugar is the Butane sugar that configures the boot disk, which a kiln image owns:
// its partitions, A/B roots and boot loader are the bake's. Butane expands these into
// storage and file entries on the boot disk, which would be refused by their generated
// JSON paths; the key the user wrote is named instead.
var butaneSugar = map[string]string{
	"boot_device": "mirrors or encrypts the boot disk; a kiln image's boot disk is laid out by the bake (ESP, two read-only roots, data) — put RAID or LUKS on other disks under storage",
	"grub":        "sets GRUB passwords; kiln images boot with systemd-boot from the bake",
}

// checkButaneSugar refuses the boot-disk sugar of butaneSugar, naming the key and its line.
func checkButaneSugar(yml []byte) error {
	var doc yaml.Node
	if yaml.Unmarshal(yml, &doc) != nil || len(doc.Content) == 0 || doc.Content[0].Kind != yaml.MappingNode {
		return nil // the translation reports the syntax error with its line
	}
	top := doc.Content[0].Content
	for i := 0; i+1 < len(top); i += 2 {
		if why, ok := butaneSugar[top[i].Value]; ok {
			return fmt.Errorf("butane: %s (line %d): not supported: it %s", top[i].Value, top[i].Line, why)
		}
	}
	return nil
}
