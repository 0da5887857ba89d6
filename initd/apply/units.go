package apply

import (
	"context"
	"fmt"
	"path"

	"github.com/coreos/ignition/v2/config/v3_6/types"

	"github.com/kilnproject/kiln/initd/systemd"
)

// Units applies systemd.units entries below root, in this order per unit: contents to
// /etc/systemd/system/<name> (mode 0644, replacing what is there, as Ignition does),
// each drop-in to /etc/systemd/system/<name>.d/<drop-in name>, then mask: true masks it
// (mask: false unmasks it), enabled: true enables it from its [Install] section and
// enabled: false disables it (see package initd/systemd). Unchanged files are not
// rewritten and links already in place are kept.
//
// It returns the node paths it changed (unit files, drop-ins, and the unit names whose
// enablement or mask changed, as /etc/systemd/system/<name>) and whether systemd must
// reload its configuration (systemctl daemon-reload) to see the changes.
func Units(ctx context.Context, root string, units []types.Unit) (changed []string, reload bool, err error) {
	t, err := openTree(root)
	if err != nil {
		return nil, false, err
	}
	defer t.Close()
	for i, u := range units {
		if err := ctx.Err(); err != nil {
			return changed, reload, err
		}
		field := fmt.Sprintf("systemd.units[%d]", i)
		c, err := t.unit(root, field, u)
		changed = append(changed, c...)
		reload = reload || len(c) > 0
		if err != nil {
			return changed, reload, fmt.Errorf("%s (%s): %w", field, u.Name, err)
		}
	}
	return changed, reload, nil
}

func (t *tree) unit(root, field string, u types.Unit) ([]string, error) {
	unitPath := path.Join("/", systemd.ConfigDir, u.Name)
	var changed []string
	write := func(p string, contents string) error {
		dir, base, err := t.split(p)
		if err != nil {
			return err
		}
		target := path.Join(dir, base)
		data := []byte(contents)
		if fi, err := t.root.Lstat(target); err == nil && fi.Mode().IsRegular() && t.sameContents(target, fi, data) {
			c, err := t.setMeta(target, fi, 0o644, false, 0, 0)
			if c {
				changed = append(changed, p)
			}
			return err
		}
		if err := t.writeFile(dir, base, data, 0o644, 0, 0); err != nil {
			return err
		}
		changed = append(changed, p)
		return nil
	}
	if u.Contents != nil {
		if err := write(unitPath, *u.Contents); err != nil {
			return changed, fmt.Errorf("%s.contents: %w", field, err)
		}
	}
	for j, d := range u.Dropins {
		if d.Contents == nil {
			continue // Validate refuses this; nothing to write
		}
		p := path.Join(unitPath+".d", d.Name)
		if err := write(p, *d.Contents); err != nil {
			return changed, fmt.Errorf("%s.dropins[%d]: %w", field, j, err)
		}
	}
	type op struct {
		name string
		fn   func(root, unit string) (bool, error)
	}
	var ops []op
	if u.Mask != nil {
		if *u.Mask {
			ops = append(ops, op{"mask", systemd.Mask})
		} else {
			ops = append(ops, op{"mask", systemd.Unmask})
		}
	}
	if u.Enabled != nil {
		if *u.Enabled {
			ops = append(ops, op{"enabled", systemd.Enable})
		} else {
			ops = append(ops, op{"enabled", systemd.Disable})
		}
	}
	for _, o := range ops {
		c, err := o.fn(root, u.Name)
		if err != nil {
			return changed, fmt.Errorf("%s.%s: %w", field, o.name, err)
		}
		if c {
			changed = append(changed, unitPath)
		}
	}
	return changed, nil
}
