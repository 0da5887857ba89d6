#!/usr/bin/env bash
# Checks the host tools kiln needs and names the Debian packages that provide the missing ones.
# Run as root it installs them (apt-get), saying so; otherwise it prints the command and fails.
#
#   builder/scripts/deps.sh            # tools to bake and boot images
#   builder/scripts/deps.sh test       # plus what the tests use
#   builder/scripts/deps.sh e2e        # plus what make e2e uses (registry, gcc, apt-get download)
#   builder/scripts/deps.sh bench      # plus what make bench compares kiln with (mkosi)
set -euo pipefail
declare -A need=(
  [mmdebstrap]=mmdebstrap
  [mksquashfs]=squashfs-tools
  [unsquashfs]=squashfs-tools
  [mkfs.erofs]=erofs-utils
  [fakeroot]=fakeroot
  [setfattr]=attr
  [qemu-img]=qemu-utils
  [qemu-system-x86_64]=qemu-system-x86
  [/usr/share/OVMF/OVMF_CODE_4M.fd]=ovmf
  [/usr/lib/ipxe/qemu/efi-virtio.rom]=ipxe-qemu
  [mkfs.ext4]=e2fsprogs
  [debugfs]=e2fsprogs
  [fsck.fat]=dosfstools
  [mdir]=mtools
  [sgdisk]=gdisk
  [cpio]=cpio
  [zstd]=zstd
  [xz]=xz-utils
  [tar]=tar
)
if [ "${1:-}" = test ]; then
  need[busybox]=busybox-static
  need[blkid]=util-linux
  need[mkfs.vfat]=dosfstools
  need[/usr/sbin/in.tftpd]=tftpd-hpa
  need[genisoimage]=genisoimage
  need[xorriso]=xorriso
  need[/usr/sbin/named]=bind9
  need[dig]=bind9-dnsutils
  need[mkfs.xfs]=xfsprogs
  need[strace]=strace
  need[systemd-escape]=systemd
  need[useradd]=passwd
  need[ssh]=openssh-client
  need[ssh-keygen]=openssh-client
  need[mdadm]=mdadm
  need[cryptsetup]=cryptsetup-bin
  need[/usr/bin/docker-registry]=docker-registry
fi
if [ "${1:-}" = e2e ]; then
  need[/usr/bin/docker-registry]=docker-registry
  need[gcc]=gcc
  need[/usr/lib/x86_64-linux-gnu/libc.a]=libc6-dev
  need[dpkg-deb]=dpkg
  need[pkg-config]=pkg-config
fi
if [ "${1:-}" = bench ]; then
  need[mkosi]=mkosi
  need[debootstrap]=debootstrap
  need[/usr/bin/docker-registry]=docker-registry
  need[curl]=curl
fi
missing=()
for tool in "${!need[@]}"; do
  if [[ $tool == /* ]]; then [ -e "$tool" ] && continue
  else command -v "$tool" >/dev/null 2>&1 && continue
  fi
  missing+=("${need[$tool]}")
done
[ ${#missing[@]} -eq 0 ] && exit 0
pkgs=$(printf '%s\n' "${missing[@]}" | sort -u | tr '\n' ' ')
if [ "$(id -u)" = 0 ]; then
  echo "kiln: installing missing Debian packages: $pkgs" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # shellcheck disable=SC2086
  apt-get install -y -qq --no-install-recommends $pkgs >&2
else
  echo "kiln: missing Debian packages: $pkgs" >&2
  echo "kiln: install them with: sudo apt-get install --no-install-recommends $pkgs" >&2
  exit 1
fi
