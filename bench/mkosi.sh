#!/usr/bin/env bash
# bench/mkosi.sh TREE BASE_TREE WORK MKSQUASHFS_OPTION...: mkosi (Debian's package, v14)
# building the same content as kiln's worker image: Debian bookworm with images/base/packages,
# plus what kiln adds to that base (TREE, the warm bake's root tree, minus the files BASE_TREE,
# the flattened base, has alike) as an extra tree, then made a squashfs root filesystem with
# kiln's mksquashfs options (mkosi 14 refuses its incremental mode for its own squashfs output,
# so it writes a directory and the squashfs is made from it, inside the timing). Three builds,
# each printed as "mkosi NAME SECONDS":
#   network  no caches at all: the packages are downloaded from the Debian mirror
#   cold     the packages from mkosi's package cache, nothing else kept (as kiln's cold bake
#            starts from its base image and artifacts on disk, with no tree or store cached)
#   warm     the same build again with mkosi's incremental mode (--incremental). mkosi 14
#            takes its incremental cache only when the development image's cache exists too,
#            and only a build script writes that one (need_cache_images in mkosi/__init__.py):
#            for an image with nothing to compile, as here, the second build installs every
#            package again, as mkosi users see it.
#
# mkosi makes only a root filesystem here, not a bootable disk with an initramfs as kiln does:
# its figures are a lower bound for the same image.
#
# mkosi runs its package steps in systemd-nspawn. Without systemd as PID 1 (containers, CI
# sandboxes) nspawn cannot register a scope on the system bus ("Failed to open system bus"), so
# mkosi runs it in the caller's unit (its --nspawn-keep-unit option); mkosi's work is the same.
set -euo pipefail
tree=${1:?usage: mkosi.sh TREE BASE_TREE WORK MKSQUASHFS_OPTION...}
base=${2:?usage: mkosi.sh TREE BASE_TREE WORK MKSQUASHFS_OPTION...}
work=${3:?usage: mkosi.sh TREE BASE_TREE WORK MKSQUASHFS_OPTION...}
shift 3
squashfs_opts=("$@")
here=$(cd "$(dirname "$0")" && pwd)
command -v mkosi >/dev/null || { echo "bench: mkosi is not installed (apt-get install mkosi debootstrap)" >&2; exit 1; }
mkdir -p "$work"
extra=$work/extra
rm -rf "$extra"

# What kiln adds: every entry of TREE that BASE_TREE lacks or holds otherwise.
python3 - "$tree" "$base" "$extra" <<'PY'
import hashlib, os, shutil, stat, sys
tree, base, extra = sys.argv[1:]
def same(a, b):
    try:
        sa, sb = os.lstat(a), os.lstat(b)
    except FileNotFoundError:
        return False
    if stat.S_IFMT(sa.st_mode) != stat.S_IFMT(sb.st_mode):
        return False
    if stat.S_ISLNK(sa.st_mode):
        return os.readlink(a) == os.readlink(b)
    if stat.S_ISREG(sa.st_mode):
        if sa.st_size != sb.st_size:
            return False
        with open(a, 'rb') as fa, open(b, 'rb') as fb:
            return hashlib.sha256(fa.read()).digest() == hashlib.sha256(fb.read()).digest()
    return True
n = 0
for d, dirs, files in os.walk(tree):
    rel = os.path.relpath(d, tree)
    for name in files + [x for x in dirs if os.path.islink(os.path.join(d, x))]:
        src = os.path.join(d, name)
        r = os.path.normpath(os.path.join(rel, name))
        if same(src, os.path.join(base, r)):
            continue
        dst = os.path.join(extra, r)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        if os.path.islink(src):
            os.symlink(os.readlink(src), dst)
        else:
            shutil.copy2(src, dst)
        n += 1
print(f"  mkosi extra tree: {n} files kiln adds to the base", file=sys.stderr)
PY

packages=$(grep -v '^#' "$here/../images/base/packages" | tr -s ' \n' ',' | sed 's/^,//; s/,$//')
conf=$work/conf
mkdir -p "$conf"
cat > "$conf/mkosi.default" <<EOF
[Distribution]
Distribution=debian
Release=bookworm

[Output]
Format=directory
OutputDirectory=$work/out

[Content]
Packages=$packages
ExtraTrees=$extra
WithDocs=no
Cache=$work/cache
EOF
mkdir -p "$work/out" "$work/cache"
build() { # name, then mkosi flags
  local name=$1; shift
  local t0 t1
  t0=$(date +%s.%N)
  if ! (cd "$conf" && mkosi --nspawn-keep-unit "$@" build) > "$work/$name.log" 2>&1; then
    echo "bench: mkosi $name failed (see $work/$name.log)" >&2
    tail -20 "$work/$name.log" >&2
    return 1
  fi
  local dir
  dir=$(find "$work/out" -mindepth 1 -maxdepth 2 -type d -name image | head -1)
  [ -d "$dir/usr" ] || { echo "bench: mkosi $name wrote no image directory under $work/out" >&2; return 1; }
  mksquashfs "$dir" "$work/$name.squashfs" -noappend "${squashfs_opts[@]}" >>"$work/$name.log" 2>&1
  t1=$(date +%s.%N)
  awk -v a="$t0" -v b="$t1" -v n="$name" 'BEGIN { printf "mkosi %s %.1f\n", n, b - a }'
}
# -f removes the last output, -ff also the incremental cache, -fff also the package cache.
build network --incremental -fff
build cold --incremental -ff
build warm --incremental -f
