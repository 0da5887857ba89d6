#!/usr/bin/env bash
# Builds kiln's default base OS: a minimal Debian bookworm root filesystem made with mmdebstrap,
# written as a tar archive. `kiln base import` then turns it into a one-layer OCI image.
#
#   images/base/build.sh OUT.tar
#
# Needs mmdebstrap (root, or unprivileged user namespaces for its unshare mode).
set -euo pipefail
out=${1:?usage: build.sh OUT.tar}
here=$(cd "$(dirname "$0")" && pwd)
list=$(grep -v '^#' "$here/packages")
# KILN_BASE_KERNEL replaces the kernel package (the linux-image-* line of packages), e.g.
# linux-image-amd64: Debian's generic kernel, whose drivers and filesystems are modules.
[ -n "${KILN_BASE_KERNEL:-}" ] && list=$(printf '%s\n%s\n' "$(grep -v '^linux-image-' <<<"$list")" "$KILN_BASE_KERNEL")
packages=$(tr -s ' \n' ',' <<<"$list" | sed 's/^,//; s/,$//')
# KILN_BASE_EXTRA_PACKAGES adds packages (comma-separated), e.g. cloud-init for `make bench`.
[ -n "${KILN_BASE_EXTRA_PACKAGES:-}" ] && packages="$packages,$KILN_BASE_EXTRA_PACKAGES"
mirror=${KILN_DEBIAN_MIRROR:-http://deb.debian.org/debian}
security=${KILN_DEBIAN_SECURITY:-http://deb.debian.org/debian-security}
tmp="$out.tmp.$$"
trap 'rm -f "$tmp"' EXIT
# INITRD=No: the kernel package's hook makes no initramfs (kiln builds its own; customize.sh
# removed the one initramfs-tools made). force-unsafe-io: dpkg does not fsync each unpacked file
# of a tree that becomes a tar when it is done (customize.sh keeps the option out of the image).
# Together: mmdebstrap 126 s -> 86 s on a 2-core VM, the same files.
INITRD=No mmdebstrap --variant=minbase --mode=auto --format=tar \
  --include="$packages" \
  --dpkgopt='force-unsafe-io' \
  --dpkgopt='path-exclude=/usr/share/man/*' \
  --dpkgopt='path-exclude=/usr/share/doc/*' \
  --dpkgopt='path-exclude=/usr/share/locale/*' \
  --dpkgopt='path-exclude=/usr/share/info/*' \
  --customize-hook="$here/customize.sh \"\$1\"" \
  bookworm "$tmp" \
  "deb $mirror bookworm main" \
  "deb $mirror bookworm-updates main" \
  "deb $security bookworm-security main"
mv "$tmp" "$out"
trap - EXIT
