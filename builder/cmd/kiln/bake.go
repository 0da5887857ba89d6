package main

import (
	"crypto"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/spf13/cobra"

	"github.com/kilnproject/kiln/builder/artifact"
	"github.com/kilnproject/kiln/builder/bake"
	"github.com/kilnproject/kiln/builder/cacherepo"
	"github.com/kilnproject/kiln/builder/provenance"
)

// bakeLong is `kiln bake --help`.
const bakeLong = `Bake builds <out>/<image>-<role>.raw (GPT: ESP with systemd-boot, kernel and kiln's initramfs;
read-only root filesystem; a spare slot for updates), converts it to the definition's formats
and writes <out>/<image>-<role>.json describing partitions, digests and versions. The pxe format
is a directory <out>/<image>-<role>-pxe/ for network boots: the disk's kernel and initramfs, the
root filesystem image (rootfs.img) and a live-boot boot.ipxe, each file's sha256 in the .json.
The iso format is <out>/<image>-<role>.iso, a hybrid ISO 9660 image (volume KILN_LIVE) that boots
live under UEFI from a CD, a virtual medium or, written with dd, a USB stick: its El Torito EFI
image (also the EFI system partition of its GPT) holds systemd-boot, the kernel and initramfs,
and stage 1 copies /kiln/root.img from the medium into RAM, checked against its sha256, with no
network. Its node config comes as a live boot's does (kiln.config.url=, fw_cfg on qemu, a
CIDATA volume). The initramfs gets sr_mod and isofs; the default cloud kernel has no ahci and no
USB, so SATA CD drives, BMC virtual media and USB sticks need the generic kernel with those
drivers in kernel.modules. xorriso writes it. With iso: {install: {dev: auto}} in the definition
the ISO is an installer too: it carries the raw disk zstd-compressed (/kiln/disk.raw.zst) and its
default boot entry writes it to a disk from the medium (stage 1's install mode: an empty disk
unless wipe, never the etcd volume nor the medium's own disk) and reboots into it; the live entry
stays in the boot menu.

Every input must be pinned (run ` + "`kiln lock`" + ` first); every downloaded byte is verified
against its sha256 or OCI digest. Pre-pulled container images are fetched by digest into the
cache (a second bake does not contact the registry) and laid into one OCI layout at
/usr/lib/kiln/images. With a kubernetes section in the profile, the versions of the kubelet and
runtime laid into the image are read from their Go build information (never by running them)
and must match it. An image that would carry a private key or a bootstrap token is refused. A failed bake leaves nothing in the output directory.
SOURCE_DATE_EPOCH sets the creation time recorded in the image (default 0).

--cache-repo REGISTRY/REPO (or $KILN_CACHE_REPO) shares the build cache between machines, CI
runners that start with an empty ~/.cache/kiln: a flattened base, a pre-pulled image's applied
layers or a compressed initramfs that the local cache lacks is pulled from that repository, and
one this bake makes is pushed to it, each an OCI artifact tagged <kind>-<key> (kinds base-trees,
trees, initramfs; keys are content digests of the inputs) with the credentials kiln uses for
any registry. A pulled entry is used only once its blobs match their digests and its tree the
listing it records; one that does not is reported, made here and pushed again. A registry
that cannot be reached is one warning and the bake goes on with the local cache; one that
refuses a push (credentials that may only pull) is one warning and is still pulled from. Anyone who can push to the repository decides what later bakes from it contain: give
push rights only to what you would let change your images.

worker, control-plane and etcd are the Kubernetes roles. A profile of any other name bakes a
plain node: first boot applies its Ignition config and runs no Kubernetes task (such a profile
has no kubernetes section and no templates).

--profile-overlay FILE (repeatable) replaces, by name, where the role's artifacts and images
come from, e.g. a local mirror:

  artifacts:
    - {name: kubelet, url: http://127.0.0.1:8080/kubelet, sha256: …}
  images:
    - {name: registry.k8s.io/pause:3.10.2, source: 127.0.0.1:5000/pause:3.10.2, digest: sha256:…}

An entry that names nothing in any profile is an error. Registries on 127.0.0.1, ::1 and
localhost are reached over plain HTTP. Registry credentials (base and pre-pulled images) are
found as docker, crane and ko find them: $DOCKER_CONFIG/config.json (default
~/.docker/config.json) "auths", and "credHelpers"/"credsStore" naming docker-credential-<name>
helpers on PATH; see docs/registries.md.

--without-images bakes the role without its pre-pulled images (image.json says
"imagesLeftOut": true): containerd pulls them when kubelet first needs them, so the node needs a
registry (or a mirror in /etc/containerd/certs.d, delivered by its Ignition config). It exists to
measure what pre-pulling saves and for sites that would rather pull than carry the images.

The pre-pulled images are laid as an OCI layout (/usr/lib/kiln/images) and as
containerd's store (/usr/lib/kiln/containerd, its content linking into the layout), each image's
layers applied into one read-only directory (/usr/lib/kiln/snapshots/<chain ID>). First boot
copies the store's few small files into /var/lib/containerd before containerd starts: the images
are ready, nothing is imported or unpacked. An image holding what that directory cannot (file
capabilities or other extended attributes, device nodes) is imported at first boot instead;
image.json says which ("unpacked", "importReason"). --import-images lays the layout only, so that
first boot imports every image, to measure what the store saves.`

// bakeExample is `kiln bake`'s examples.
const bakeExample = `  kiln bake images/qemu.yaml --role worker -o out
  kiln bake images/metal.yaml --role worker -o out   # metal-worker.raw and metal-worker-pxe/
                                                    # (formats: [iso] writes metal-worker.iso)
  kiln bake images/qemu.yaml --role control-plane -o out --kiln-init bin/kiln-init --kiln-stage1 bin/kiln-stage1
  kiln bake images/qemu.yaml --role worker -o out --profile-overlay mirror.yaml
  kiln bake images/qemu.yaml --role worker -o out-pull --without-images
  kiln bake images/qemu.yaml --role worker -o out-import --import-images
  kiln bake images/qemu.yaml --role worker -o out --sign-key kiln.key   # + qemu-worker.intoto.jsonl (kiln verify)
  kiln bake images/qemu.yaml --role worker -o out --cache-repo registry.example.com/ci/kiln-cache`

// bakeOptions are `kiln bake`'s flags.
type bakeOptions struct {
	role, out, kilnInit, stage1 string
	signKey, cacheRepo          string
	overlays                    []string
	withoutImages, importImages bool
}

func newBakeCmd() *cobra.Command {
	var b bakeOptions
	cmd := &cobra.Command{
		Use:     "bake DEFINITION --role ROLE",
		Short:   "Bake the image of one role from a definition",
		Long:    bakeLong,
		Example: bakeExample,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return b.run(cmd, args[0])
		},
	}
	cmd.Flags().StringVar(&b.role, "role", "", "role profile to bake: worker, control-plane, etcd (profiles/<role>.yaml)")
	cmd.Flags().StringVarP(&b.out, "output", "o", "out", "output directory")
	cmd.Flags().StringVar(&b.kilnInit, "kiln-init", "", "static kiln-init binary, the node agent on the image's root (default: $KILN_INIT, or kiln-init next to kiln)")
	cmd.Flags().StringVar(&b.stage1, "kiln-stage1", "", "static kiln-stage1 binary, the initramfs' /init (default: $KILN_STAGE1, or kiln-stage1 next to the kiln-init binary)")
	cmd.Flags().StringVar(&b.signKey, "sign-key", "", "PEM private key (ed25519 or ECDSA P-256) to sign the bake's provenance with, <image>-<role>.intoto.jsonl (default: $KILN_SIGN_KEY; kiln verify checks it)")
	cmd.Flags().StringArrayVar(&b.overlays, "profile-overlay", nil, "YAML document replacing artifact url/path/sha256 and image source/digest by name (repeatable, applied in order)")
	cmd.Flags().BoolVar(&b.withoutImages, "without-images", false, "leave the profile's pre-pulled images out: nodes pull them from a registry at first boot")
	cmd.Flags().BoolVar(&b.importImages, "import-images", false, "lay the pre-pulled images as an OCI layout only, without containerd's store: first boot imports and unpacks them")
	cmd.Flags().StringVar(&b.cacheRepo, "cache-repo", "", "OCI repository whose cache entries this bake pulls and pushes, shared by CI runners (default: $KILN_CACHE_REPO)")
	_ = cmd.MarkFlagRequired("role")
	return cmd
}

// run bakes the role's image from definition and prints the outputs it wrote.
func (b *bakeOptions) run(cmd *cobra.Command, definition string) error {
	if b.kilnInit == "" {
		b.kilnInit = defaultKilnInit()
	}
	if b.stage1 == "" {
		b.stage1 = defaultStage1(b.kilnInit)
	}
	if b.signKey == "" {
		b.signKey = os.Getenv("KILN_SIGN_KEY")
	}
	var signer crypto.Signer
	if b.signKey != "" {
		var err error
		if signer, err = provenance.LoadPrivateKey(b.signKey); err != nil {
			return fmt.Errorf("--sign-key: %w", err)
		}
	}
	cache, err := artifact.DefaultCache()
	if err != nil {
		return err
	}
	remote := artifact.RemoteOptions(authn.DefaultKeychain)
	if b.cacheRepo == "" {
		b.cacheRepo = os.Getenv("KILN_CACHE_REPO")
	}
	var repo *cacherepo.Repo
	if b.cacheRepo != "" {
		if repo, err = cacherepo.New(b.cacheRepo, remote, slog.Default()); err != nil {
			return fmt.Errorf("--cache-repo: %w", err)
		}
	}
	created, err := sourceDateEpoch()
	if err != nil {
		return err
	}
	res, err := bake.Bake(cmd.Context(), bake.Options{
		Definition: definition, Role: b.role, OutDir: b.out, KilnInit: b.kilnInit, Stage1: b.stage1,
		Cache: cache, Log: slog.Default(), Version: version, Created: created,
		ProfileOverlays: b.overlays, WithoutImages: b.withoutImages, ImportImages: b.importImages, SignKey: signer,
		ImageFetch: artifact.ImageFetch{Remote: remote}, CacheRepo: repo,
	})
	if err != nil {
		return err
	}
	logPeakMemory(slog.Default())
	for _, o := range res.Outputs {
		fmt.Fprintln(cmd.OutOrStdout(), o)
	}
	return nil
}

// defaultKilnInit finds the kiln-init binary: $KILN_INIT, else next to the kiln executable.
func defaultKilnInit() string {
	if p := os.Getenv("KILN_INIT"); p != "" {
		return p
	}
	if exe, err := os.Executable(); err == nil {
		return filepath.Join(filepath.Dir(exe), "kiln-init")
	}
	return "kiln-init"
}

// defaultStage1 finds the kiln-stage1 binary: $KILN_STAGE1, else next to kilnInit (make
// build writes both to bin/).
func defaultStage1(kilnInit string) string {
	if p := os.Getenv("KILN_STAGE1"); p != "" {
		return p
	}
	return filepath.Join(filepath.Dir(kilnInit), "kiln-stage1")
}

// sourceDateEpoch is the creation time SOURCE_DATE_EPOCH asks for, 1970-01-01 without it.
func sourceDateEpoch() (time.Time, error) {
	s := os.Getenv("SOURCE_DATE_EPOCH")
	if s == "" {
		return time.Unix(0, 0).UTC(), nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH=%q: not a number of seconds", s)
	}
	return time.Unix(n, 0).UTC(), nil
}

// logPeakMemory logs the bake's peak resident memory: kiln's own and that of the largest tool
// it ran (mksquashfs, mkfs, qemu-img), as getrusage reports them. Linux counts in a tool's
// figure the pages kiln had when it started the tool, so the second is never below kiln's
// own at that moment: a tool equal to kiln's figure used no more than that.
func logPeakMemory(log *slog.Logger) {
	var self, children syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &self) != nil || syscall.Getrusage(syscall.RUSAGE_CHILDREN, &children) != nil {
		return
	}
	// Linux reports ru_maxrss in KiB.
	log.Info("peak memory", "kiln_mib", self.Maxrss>>10, "largest_tool_mib", children.Maxrss>>10)
}
