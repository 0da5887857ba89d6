package config

import (
	"errors"
	"fmt"
	"strings"

	butane "github.com/coreos/butane/config"
	"github.com/coreos/butane/config/common"
	"github.com/coreos/go-semver/semver"
	"github.com/coreos/vcontext/report"
	"gopkg.in/yaml.v3"
)

// Butane versions kiln accepts: variant fcos up to 1.6.0, whose output is Ignition 3.5
// or older. Other variants add platform features (OpenShift MachineConfigs, Flatcar
// specifics) that mean nothing on a kiln node.
const (
	butaneVariant    = "fcos"
	butaneMaxVersion = "1.6.0"
)

// TranslateButane translates a Butane YAML document (variant fcos, version 1.0.0 to
// 1.6.0) to Ignition JSON. Errors name the YAML path with line and column; an unknown
// key is an error. Butane's warnings are dropped: Parse keeps them (Parse accepts
// Butane directly).
func TranslateButane(yml []byte) ([]byte, error) {
	out, _, err := translateButane(yml)
	return out, err
}

func translateButane(yml []byte) ([]byte, []string, error) {
	if err := checkButaneVersion(yml); err != nil {
		return nil, nil, err
	}
	out, rpt, err := butane.TranslateBytes(yml, common.TranslateBytesOptions{})
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
	want := fmt.Sprintf("kiln takes Ignition JSON (spec 3.0.0 to 3.5.0) or Butane YAML with variant: %s and version: 1.0.0 to %s", butaneVariant, butaneMaxVersion)
	switch {
	case head.Variant == "" && strings.HasPrefix(strings.TrimSpace(string(yml)), "#cloud-config"):
		return errors.New("cloud-config user data is not supported: " + want)
	case head.Variant == "":
		return errors.New("butane: variant is not set; " + want)
	case head.Variant != butaneVariant:
		return fmt.Errorf("butane: variant %q is not supported; %s", head.Variant, want)
	}
	v, err := semver.NewVersion(head.Version)
	if err != nil {
		return fmt.Errorf("butane: version %q is not a version like 1.6.0; %s", head.Version, want)
	}
	if v.PreRelease != "" || v.Major != 1 || semver.New(butaneMaxVersion).LessThan(*v) {
		return fmt.Errorf("butane: version %s of variant %s is not supported; %s", head.Version, head.Variant, want)
	}
	return nil
}
