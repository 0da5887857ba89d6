package storage

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/coreos/ignition/v2/config/v3_6/types"
	"github.com/vincent-petithory/dataurl"

	"github.com/kilnproject/kiln/initd/blockdev"
	"github.com/kilnproject/kiln/initd/config"
	"github.com/kilnproject/kiln/internal/atomicfile"
)

// Where LUKS keys and the table that opens the volumes at boot live on the node (the
// key directory as Fedora CoreOS has it).
const (
	luksKeyDir = "/etc/luks"
	crypttab   = "/etc/crypttab"
	mapperDir  = "/dev/mapper"
)

// luksVolumes sets up each storage.luks volume:
//
//   - its key (keyFile: a data: or http(s) URL, verified against its hash; without one a
//     random key, as Ignition makes) is stored in /etc/luks/<name>, 0600, and
//     /etc/crypttab opens the volume with it at every later boot;
//   - a LUKS volume with the wanted UUID and label (those given) is kept and opened with
//     the key; a key that does not open it is an error;
//   - a blank device is formatted (cryptsetup luksFormat, LUKS2, cryptsetup's default
//     key derivation);
//   - anything else (another LUKS volume, a filesystem) is refused unless wipeVolume. A
//     volume kiln itself formatted for this entry in an earlier run (recorded in
//     /var/lib/kiln/storage.json) is kept even with wipeVolume, so re-runs never
//     reformat it.
func (a *applier) luksVolumes(ctx context.Context, st types.Storage) error {
	for i, l := range st.Luks {
		if err := a.luks(ctx, fmt.Sprintf("storage.luks[%d]", i), l); err != nil {
			return err
		}
	}
	return nil
}

// luks sets up the storage.luks volume l at field (see luksVolumes).
func (a *applier) luks(ctx context.Context, field string, l types.Luks) error {
	real, err := a.device(ctx, field+".device", deref(l.Device))
	if err != nil {
		return err
	}
	keyPath := path.Join(luksKeyDir, l.Name)
	hostKey := filepath.Join(a.o.Root, keyPath)
	// The key is written beside the stored one and takes its place only once it opened the
	// volume or formatted it: a config with another key must not lose the one that opens it.
	newKey := hostKey + ".new"
	if err := a.candidateKey(ctx, field, l, hostKey, newKey); err != nil {
		return err
	}
	defer os.Remove(newKey)
	uuid, err := a.luksVolume(ctx, field, l, real, newKey)
	if err != nil {
		return err
	}
	if err := a.storeKey(field, l.Name, hostKey, newKey); err != nil {
		return err
	}
	if err := a.writeCrypttab(field, l, uuid, keyPath); err != nil {
		return err
	}
	if !a.o.Live {
		return nil
	}
	return a.openLuks(ctx, field, l, real, hostKey)
}

// luksVolume keeps the LUKS volume on real when it is the one l wants and newKey opens it,
// or formats it with newKey (refusing to erase anything but a blank device unless
// wipeVolume); it returns the volume's UUID.
func (a *applier) luksVolume(ctx context.Context, field string, l types.Luks, real, newKey string) (string, error) {
	dev := deref(l.Device)
	sig, err := blockdev.Probe(ctx, real)
	if err != nil {
		return "", fieldErr(field+".device", "%s: %w", dev, err)
	}
	mismatch := luksMismatch(sig, l)
	st, err := loadState(a.o.Root)
	if err != nil {
		return "", fieldErr(field, "%w", err)
	}
	stateKey := "luks " + l.Name + " " + dev
	ours := !sig.Blank && mismatch == "" && st.Made[stateKey] == strings.ToLower(sig.UUID)
	format := sig.Blank || mismatch != "" || deref(l.WipeVolume) && !ours
	if mismatch != "" && !deref(l.WipeVolume) {
		return "", fieldErr(field+".device", "%s %s; refusing to format it (wipeVolume: true erases it)", describeDev(dev, real), mismatch)
	}
	if !format {
		if _, err := run(ctx, "cryptsetup", "open", "--test-passphrase", "--key-file", newKey, "--", real); err != nil {
			return "", fieldErr(field+".keyFile", "the key does not open the LUKS volume on %s, which is kept (wipeVolume: true formats it anew): %w", dev, err)
		}
		return sig.UUID, nil
	}
	if sig, err = a.luksFormat(ctx, field, l, real, newKey, sig.Blank); err != nil {
		return "", err
	}
	st.Made[stateKey] = strings.ToLower(sig.UUID)
	if err := st.save(a.o.Root); err != nil {
		return "", fieldErr(field, "%w", err)
	}
	a.note(field, "formatted %s as LUKS volume %s (UUID %s)", dev, l.Name, sig.UUID)
	return sig.UUID, nil
}

// luksMismatch says how what the device holds (sig) is not the LUKS volume l wants, or is ""
// when it is (or the device is blank).
func luksMismatch(sig blockdev.Signature, l types.Luks) string {
	switch {
	case sig.Blank:
	case sig.Type != "crypto_LUKS":
		return fmt.Sprintf("holds %s", sig)
	case deref(l.UUID) != "" && !strings.EqualFold(sig.UUID, deref(l.UUID)):
		return fmt.Sprintf("holds %s, not UUID %s", sig, deref(l.UUID))
	case deref(l.Label) != "" && sig.Label != deref(l.Label):
		return fmt.Sprintf("holds %s, not labelled %q", sig, deref(l.Label))
	}
	return ""
}

// luksFormat erases real (unless blank) and formats it as the LUKS volume l with newKey; it
// returns what the device holds then.
func (a *applier) luksFormat(ctx context.Context, field string, l types.Luks, real, newKey string, blank bool) (blockdev.Signature, error) {
	dev := deref(l.Device)
	if err := a.writable(field+".device", dev, real); err != nil {
		return blockdev.Signature{}, err
	}
	if !blank {
		if _, err := run(ctx, "wipefs", "-a", "--", real); err != nil {
			return blockdev.Signature{}, fieldErr(field+".wipeVolume", "%w", err)
		}
	}
	if _, err := run(ctx, "cryptsetup", append(a.luksFormatArgs(l, newKey), "--", real)...); err != nil {
		return blockdev.Signature{}, fieldErr(field, "luksFormat %s: %w", dev, err)
	}
	sig, err := blockdev.Probe(ctx, real)
	if err != nil || sig.Type != "crypto_LUKS" {
		return sig, fieldErr(field, "after luksFormat, blkid finds %s on %s (%v)", sig, dev, err)
	}
	return sig, nil
}

// luksFormatArgs are cryptsetup's arguments formatting the LUKS2 volume l with newKey.
func (a *applier) luksFormatArgs(l types.Luks, newKey string) []string {
	args := []string{"luksFormat", "--type", "luks2", "--batch-mode", "--key-file", newKey}
	if v := deref(l.Label); v != "" {
		args = append(args, "--label", v)
	}
	if v := deref(l.UUID); v != "" {
		args = append(args, "--uuid", v)
	}
	if a.o.cheapKDF {
		args = append(args, "--pbkdf", "pbkdf2", "--iter-time", "1")
	}
	for _, o := range l.Options {
		args = append(args, string(o))
	}
	return args
}

// openLuks opens the LUKS volume l on real with the key in hostKey as /dev/mapper/<name>,
// unless it is open already.
func (a *applier) openLuks(ctx context.Context, field string, l types.Luks, real, hostKey string) error {
	dev := deref(l.Device)
	mapped := filepath.Join(mapperDir, l.Name)
	if _, err := os.Stat(mapped); err == nil {
		return nil
	}
	args := []string{"open", "--type", "luks", "--key-file", hostKey}
	if deref(l.Discard) {
		args = append(args, "--allow-discards")
	}
	for _, o := range l.OpenOptions {
		args = append(args, string(o))
	}
	if _, err := run(ctx, "cryptsetup", append(args, "--", real, l.Name)...); err != nil {
		return fieldErr(field, "open %s as %s: %w", dev, l.Name, err)
	}
	a.note(field, "opened %s as %s", dev, mapped)
	_, err := a.device(ctx, field, mapped)
	return err
}

// candidateKey writes the volume's key to newKey (0600): the keyFile's contents, or the
// key stored in hostKey already, or a new random one.
func (a *applier) candidateKey(ctx context.Context, field string, l types.Luks, hostKey, newKey string) error {
	old, err := os.ReadFile(hostKey)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fieldErr(field, "read key: %w", err)
	}
	src, hash := deref(l.KeyFile.Source), deref(l.KeyFile.Verification.Hash)
	var key []byte
	lower := strings.ToLower(src)
	switch {
	case src == "" && old != nil:
		key = old
	case src == "":
		key = make([]byte, 64)
		rand.Read(key)
	case strings.HasPrefix(lower, "data:"):
		du, err := dataurl.DecodeString(src)
		if err != nil {
			return fieldErr(field+".keyFile.source", "decode data URL: %w", err)
		}
		key = du.Data
	case old != nil && hash != "" && config.VerifyHash(hash, old) == nil:
		key = old // fetched by an earlier run
	default:
		if a.o.Get == nil {
			return fieldErr(field+".keyFile.source", "no way to fetch %s was given", src)
		}
		if key, err = a.o.Get(ctx, src); err != nil {
			return fieldErr(field+".keyFile.source", "fetch %s: %w", src, err)
		}
	}
	if hash != "" {
		if err := config.VerifyHash(hash, key); err != nil {
			return fieldErr(field+".keyFile.verification.hash", "%w", err)
		}
	}
	if len(key) == 0 {
		return fieldErr(field+".keyFile.source", "the key is empty")
	}
	if err := atomicfile.Write(newKey, key, atomicfile.Options{Mode: 0o600, DirMode: 0o700}); err != nil {
		return fieldErr(field, "store key: %w", err)
	}
	return nil
}

// storeKey moves newKey, which opened or formatted the volume, to hostKey, unless hostKey
// holds the same key already.
func (a *applier) storeKey(field, name, hostKey, newKey string) error {
	key, err := os.ReadFile(newKey)
	if err != nil {
		return fieldErr(field, "store key: %w", err)
	}
	if old, err := os.ReadFile(hostKey); err == nil && bytes.Equal(old, key) {
		if fi, err := os.Stat(hostKey); err == nil && fi.Mode().Perm() == 0o600 {
			return nil
		}
	}
	if err := os.Rename(newKey, hostKey); err != nil {
		return fieldErr(field, "store key: %w", err)
	}
	a.note(field, "stored the key in %s", path.Join(luksKeyDir, name))
	return nil
}

// writeCrypttab makes /etc/crypttab's line for the volume (name UUID=… /etc/luks/name
// luks[,discard][,…]) the one it must be, keeping every other line.
func (a *applier) writeCrypttab(field string, l types.Luks, uuid, keyPath string) error {
	opts := []string{"luks"}
	if deref(l.Discard) {
		opts = append(opts, "discard")
	}
	for _, o := range l.OpenOptions {
		if c := config.LuksOpenOptions[string(o)]; c != "" && !(c == "discard" && deref(l.Discard)) {
			opts = append(opts, c)
		}
	}
	line := fmt.Sprintf("%s UUID=%s %s %s", l.Name, uuid, keyPath, strings.Join(opts, ","))
	file := filepath.Join(a.o.Root, crypttab)
	old, err := os.ReadFile(file)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fieldErr(field, "read %s: %w", crypttab, err)
	}
	var out []string
	found := false
	for _, ln := range strings.Split(strings.TrimRight(string(old), "\n"), "\n") {
		if f := strings.Fields(ln); len(f) > 0 && f[0] == l.Name {
			if !found {
				out = append(out, line)
			}
			found = true
			continue
		}
		if ln != "" || len(out) > 0 {
			out = append(out, ln)
		}
	}
	if !found {
		out = append(out, line)
	}
	data := []byte(strings.Join(out, "\n") + "\n")
	if bytes.Equal(old, data) {
		return nil
	}
	if err := atomicfile.Write(file, data, atomicfile.Options{Mode: 0o644, DirMode: 0o755}); err != nil {
		return fieldErr(field, "write %s: %w", crypttab, err)
	}
	a.note(field, "%s opens %s at boot", crypttab, l.Name)
	return nil
}
