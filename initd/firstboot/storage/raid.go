package storage

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/coreos/ignition/v2/config/v3_6/types"

	"github.com/kilnproject/kiln/initd/blockdev"
	"github.com/kilnproject/kiln/initd/config"
)

// mdDir is where mdadm names arrays: /dev/md/<name>.
const mdDir = "/dev/md"

// raids creates each storage.raid array, or assembles it when its members already carry
// its superblock (an earlier run, or a later boot before udev assembled it):
//
//   - every member (devices and spares) carries an md superblock of this array's name and
//     one array UUID: the array is assembled (if it is not running already) as
//     /dev/md/<name>, never created again;
//   - every member is blank: mdadm --create --homehost=any, so later boots assemble it
//     under the same name wherever the disks are;
//   - anything else on a member (a filesystem, another array's superblock) is refused,
//     naming the member and what it holds.
func (a *applier) raids(ctx context.Context, st types.Storage) error {
	for i, r := range st.Raid {
		if err := a.raid(ctx, fmt.Sprintf("storage.raid[%d]", i), r); err != nil {
			return err
		}
	}
	return nil
}

// mdExamine is what mdadm --examine says of a member's superblock.
type mdExamine struct {
	name, uuid, level string
}

func examine(ctx context.Context, dev string) (mdExamine, error) {
	out, err := run(ctx, "mdadm", "--examine", "--export", "--", dev)
	if err != nil {
		return mdExamine{}, err
	}
	var e mdExamine
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), "=")
		switch k {
		case "MD_NAME":
			e.name = v
		case "MD_UUID":
			e.uuid = v
		case "MD_LEVEL":
			e.level = v
		}
	}
	return e, nil
}

// mdName is the array name of an md superblock name: "any:data" and "host:data" are "data".
func mdName(s string) string {
	if _, n, ok := strings.Cut(s, ":"); ok {
		return n
	}
	return s
}

// raidMember is a device of an array: as the config names it (dev), the device node it
// resolves to (real) and the config field naming it.
type raidMember struct{ dev, real, field string }

// raid creates or assembles the storage.raid array r at field (see raids).
func (a *applier) raid(ctx context.Context, field string, r types.Raid) error {
	level, _ := config.RaidLevel(deref(r.Level)) // validated
	var members []raidMember
	for i, d := range r.Devices {
		f := fmt.Sprintf("%s.devices[%d]", field, i)
		real, err := a.device(ctx, f, string(d))
		if err != nil {
			return err
		}
		members = append(members, raidMember{string(d), real, f})
	}
	target := filepath.Join(mdDir, r.Name)
	blank, ours, arrays, err := probeMembers(ctx, r.Name, level, members)
	if err != nil {
		return err
	}
	switch {
	case ours == len(members) && arrays == 1:
		if active(target) {
			return nil
		}
		if err := a.assembleRaid(ctx, field, target, members); err != nil {
			return err
		}
	case blank == len(members):
		if err := a.createRaid(ctx, field, target, level, r, members); err != nil {
			return err
		}
	default:
		return fieldErr(field, "of its %d devices, %d carry array %q and %d are blank (or they carry more than one array UUID); refusing to create or assemble it",
			len(members), ours, r.Name, blank)
	}
	if _, err := a.device(ctx, field, target); err != nil {
		return err
	}
	return nil
}

// probeMembers counts the members that are blank and those that carry the superblock of the
// array name at level, and the array UUIDs these carry; anything else on a member is refused.
func probeMembers(ctx context.Context, name, level string, members []raidMember) (blank, ours, arrays int, err error) {
	uuids := map[string]bool{}
	for _, m := range members {
		sig, err := blockdev.Probe(ctx, m.real)
		if err != nil {
			return 0, 0, 0, fieldErr(m.field, "%s: %w", m.dev, err)
		}
		switch {
		case sig.Blank:
			blank++
		case sig.Type == "linux_raid_member":
			e, err := examine(ctx, m.real)
			if err != nil {
				return 0, 0, 0, fieldErr(m.field, "%s: %w", m.dev, err)
			}
			if mdName(e.name) != name || e.level != level {
				return 0, 0, 0, fieldErr(m.field, "%s is a member of RAID array %q (%s, UUID %s), not of %s %q; refusing to use it (wipe it by hand: wipefs -a)",
					describeDev(m.dev, m.real), mdName(e.name), e.level, e.uuid, level, name)
			}
			uuids[e.uuid] = true
			ours++
		default:
			return 0, 0, 0, fieldErr(m.field, "%s holds %s; refusing to make it a RAID member (wipe it by hand: wipefs -a)", describeDev(m.dev, m.real), sig)
		}
	}
	return blank, ours, len(uuids), nil
}

// assembleRaid assembles the array target from the members that carry its superblock.
func (a *applier) assembleRaid(ctx context.Context, field, target string, members []raidMember) error {
	args := []string{"--assemble", target}
	for _, m := range members {
		args = append(args, m.real)
	}
	if _, err := run(ctx, "mdadm", args...); err != nil {
		return fieldErr(field, "assemble %s: %w", target, err)
	}
	a.note(field, "assembled %s", target)
	return nil
}

// createRaid creates the array r as target, of level, over its blank members.
func (a *applier) createRaid(ctx context.Context, field, target, level string, r types.Raid, members []raidMember) error {
	for _, m := range members {
		if err := a.writable(m.field, m.dev, m.real); err != nil {
			return err
		}
	}
	spares := deref(r.Spares)
	args := []string{"--create", target, "--run", "--homehost=any", "--name=" + r.Name,
		"--level=" + level, "--raid-devices=" + strconv.Itoa(len(members)-spares)}
	if spares > 0 {
		args = append(args, "--spare-devices="+strconv.Itoa(spares))
	}
	for _, o := range r.Options {
		args = append(args, string(o))
	}
	for _, m := range members {
		args = append(args, m.real)
	}
	if _, err := run(ctx, "mdadm", args...); err != nil {
		return fieldErr(field, "create %s: %w", target, err)
	}
	a.note(field, "created %s %s over %d devices", level, target, len(members))
	return nil
}

// active reports whether the array dev (/dev/md/<name>) is running: its node exists and
// the kernel lists it in /proc/mdstat.
func active(dev string) bool {
	real, err := filepath.EvalSymlinks(dev)
	if err != nil {
		return false
	}
	stat, err := os.ReadFile("/proc/mdstat")
	if err != nil {
		return false
	}
	name := filepath.Base(real)
	for _, line := range strings.Split(string(stat), "\n") {
		if strings.HasPrefix(line, name+" : active") {
			return true
		}
	}
	return false
}
