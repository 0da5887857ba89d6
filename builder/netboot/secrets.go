package netboot

import (
	"errors"
	"fmt"
	"log/slog"
	"path"
	"strings"
	"testing/fstest"

	"github.com/kilnproject/kiln/builder/bake"
	"github.com/kilnproject/kiln/initd/config"
	"github.com/kilnproject/kiln/initd/systemd"
)

// errSecretsHint closes Load's refusal of configs holding secrets.
var errSecretsHint = errors.New("anyone on the boot network can fetch a config kiln serve holds: " +
	"deliver these configs another way (a CIDATA volume, see kiln serve --help), " +
	"or pass --allow-secrets on a boot network that reaches only these machines")

// maxNamed is how many machines a secrets report names before it counts the rest.
const maxNamed = 5

// secretConfigs are the configs Load found holding secrets, each config file scanned and
// reported once however many groups name it.
type secretConfigs struct {
	scanned map[string]*secretConfig // by config file
	found   []*secretConfig          // those holding secrets, in the order found
}

// secretConfig is one config file and the machines it is handed to.
type secretConfig struct {
	path string
	// where is the machines.yaml field that first names it: "machines.yaml:5: groups[0].config".
	where    string
	found    []bake.Finding
	machines []string
}

func newSecretConfigs() *secretConfigs {
	return &secretConfigs{scanned: map[string]*secretConfig{}}
}

// check scans gc's config with the bake's secret scanner the first time it sees its file and
// notes machines as handed it. Every machine of a group gets the group's config with only
// its hostname and etcd member written in, so the file's scan stands for theirs.
func (sc *secretConfigs) check(gc *groupConfig, where string, machines []*Machine) error {
	c := sc.scanned[gc.path]
	if c == nil {
		found, err := configSecrets(gc.cfg)
		if err != nil {
			return fmt.Errorf("%s: %w", gc.path, err)
		}
		c = &secretConfig{path: gc.path, where: where, found: found}
		sc.scanned[gc.path] = c
		if len(found) > 0 {
			sc.found = append(sc.found, c)
		}
	}
	for _, m := range machines {
		c.machines = append(c.machines, m.ID)
	}
	return nil
}

// report refuses every config holding secrets or, when allow, warns once for each.
func (sc *secretConfigs) report(allow bool, log *slog.Logger) []error {
	var errs []error
	for _, c := range sc.found {
		if allow {
			log.Warn("serving secrets to anyone on the boot network (--allow-secrets)",
				"config", c.path, "machines", c.machineList(), "secrets", c.secretList("; "))
			continue
		}
		errs = append(errs, fmt.Errorf("%s: %s holds secrets, and kiln serve would hand it to %s:\n    %s",
			c.where, c.path, c.machineList(), c.secretList("\n    ")))
	}
	if len(errs) > 0 {
		errs = append(errs, errSecretsHint)
	}
	return errs
}

// machineList names c's machines and the URL each fetches its config from: "machine cp-1
// (/config/cp-1)", "machines w-1, w-2, w-3, w-4, w-5 and 95 more (/config/<machine>)".
func (c *secretConfig) machineList() string {
	if len(c.machines) == 1 {
		return fmt.Sprintf("machine %s (/config/%s)", c.machines[0], c.machines[0])
	}
	names := strings.Join(c.machines[:min(len(c.machines), maxNamed)], ", ")
	if n := len(c.machines) - maxNamed; n > 0 {
		names += fmt.Sprintf(" and %d more", n)
	}
	return "machines " + names + " (/config/<machine>)"
}

func (c *secretConfig) secretList(sep string) string {
	list := make([]string, len(c.found))
	for i, f := range c.found {
		list[i] = f.String()
	}
	return strings.Join(list, sep)
}

// configSecrets scans what a config writes on the node with bake.ScanSecrets, each in
// place: every storage.files entry's contents (decoded and decompressed) at its path, every
// systemd unit and drop-in under /etc/systemd/system. Contents the node fetches from an
// http(s) URL are not kiln serve's to hand out and are not fetched.
func configSecrets(cfg *config.Config) ([]bake.Finding, error) {
	files, err := cfg.Files()
	if err != nil {
		return nil, err
	}
	tree := fstest.MapFS{} // in memory: the config's secrets are written nowhere
	add := func(p string, data []byte) {
		tree[strings.TrimPrefix(path.Clean("/"+p), "/")] = &fstest.MapFile{Data: data, Mode: 0o600}
	}
	for _, f := range files {
		add(f.Path, f.Contents)
	}
	for _, u := range cfg.Ignition.Systemd.Units {
		if u.Contents != nil {
			add(path.Join(systemd.ConfigDir, u.Name), []byte(*u.Contents))
		}
		for _, d := range u.Dropins {
			if d.Contents != nil {
				add(path.Join(systemd.ConfigDir, u.Name+".d", d.Name), []byte(*d.Contents))
			}
		}
	}
	found, err := bake.ScanSecrets(tree)
	if err != nil {
		return nil, fmt.Errorf("scan for secrets: %w", err)
	}
	return found, nil
}
