#!/usr/bin/env bash
# make bench: prints kiln's figures for the default worker image.
#   - bake time, cold (empty artifact cache, page cache dropped when root) and warm (the first
#     warm bake, then three more, each paired with the floor)
#   - a CI runner with a shared cache (kiln bake --cache-repo, a docker-registry on loopback):
#     runner A, empty cache, bakes and pushes; runner B, another empty cache, pulls and bakes
#   - a rebake after one artifact (crictl) changes, step by step
#   - the bake's peak RSS: kiln's own and the largest tool's (getrusage, logged by kiln bake)
#   - the floor: mksquashfs alone on the warm bake's root tree, with the same options; the ratio
#     warm bake / floor, the median of three pairs
#   - kiln's base made from Debian's packages (make base's steps), and mkosi (Debian's, v14)
#     building the same content: packages downloaded, cold, warm (bench/mkosi.sh)
#   - boot time under TCG to kiln-init's first-boot status line (first and second boot)
#   - image sizes: raw (apparent and allocated), qcow2; the control plane's too
#   - kiln serve under load on loopback (bench/serve): requests/s, p99 per route, peak RSS
# Needs the base (make base) and bin/kiln, bin/kiln-init, bin/kiln-stage1 (make build).
set -euo pipefail
trap 'echo "bench: failed at line $LINENO (logs in $work)" >&2' ERR
cd "$(dirname "$0")/.."
export KILN_CACHE=${KILN_CACHE:-$HOME/.cache/kiln}
KILN=$PWD/bin/kiln
work=$(mktemp -d /var/tmp/kiln-bench.XXXXXX)
# The work directory is removed at the end of a successful run and kept for a failed one.
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }

# The profiles pin upstream files; make bench passes the overlay that points them at the
# components built from source (make local-sources), as make image does.
overlay=()
[ -n "${KILN_PROFILE_OVERLAY:-}" ] && overlay=(--profile-overlay "$KILN_PROFILE_OVERLAY")
$KILN lock --update images/qemu.yaml "${overlay[@]}" >/dev/null
# A worker's config from a one-node cluster: the worker boots before its control plane exists,
# as in an autoscaling group; first boot completes, kubelet keeps retrying.
$KILN cluster init --name bench --dns-zone kiln.test --control-planes 1 --workers 1 \
  --api-endpoint 10.0.2.2:6443 -o "$work/cluster" >/dev/null

# Cold: a fresh artifact cache (the base layout is the input and stays), no page cache.
cold_cache=$work/cache
mkdir -p "$cold_cache"
ln -s "$KILN_CACHE/base" "$cold_cache/base"
sync; [ "$(id -u)" = 0 ] && echo 3 > /proc/sys/vm/drop_caches || true
t0=$(now)
KILN_CACHE=$cold_cache $KILN bake images/qemu.yaml --role worker "${overlay[@]}" -o "$work/cold" 2> "$work/cold.log" >/dev/null
t1=$(now)
cold=$(secs "$t0" "$t1")

# CI runners sharing a cache repository: a docker-registry of its own on a free loopback port.
# Runner A (an empty cache) bakes and pushes; runner B (another empty cache, no page cache)
# pulls what A pushed instead of flattening and compressing.
reg_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cat > "$work/registry.yml" <<YAML
version: 0.1
log: {level: error, accesslog: {disabled: true}}
storage: {filesystem: {rootdirectory: $work/registry}}
http: {addr: 127.0.0.1:$reg_port, secret: kiln-bench}
YAML
docker-registry serve "$work/registry.yml" > "$work/registry.log" 2>&1 &
reg_pid=$!
trap 'kill $reg_pid 2>/dev/null || true' EXIT
for _ in $(seq 100); do curl -sf -o /dev/null "http://127.0.0.1:$reg_port/v2/" && break; sleep 0.1; done
shared_bake() { # runner
  mkdir -p "$work/cache-$1"
  ln -s "$KILN_CACHE/base" "$work/cache-$1/base"
  sync; [ "$(id -u)" = 0 ] && echo 3 > /proc/sys/vm/drop_caches || true
  local a b
  a=$(now)
  KILN_CACHE=$work/cache-$1 $KILN bake images/qemu.yaml --role worker "${overlay[@]}" \
    --cache-repo "127.0.0.1:$reg_port/kiln-cache" -o "$work/runner-$1" 2> "$work/runner-$1.log" >/dev/null
  b=$(now)
  secs "$a" "$b"
}
runner_a=$(shared_bake a)
runner_b=$(shared_bake b)
# seconds and bytes logged for each entry pushed or pulled
moved() { awk -v what="$1" '$0 ~ "msg=\"cache entry " what "\"" { for (i = 1; i <= NF; i++) { if ($i ~ /^seconds=/) { sub("seconds=", "", $i); s += $i } if ($i ~ /^bytes=/) { sub("bytes=", "", $i); b += $i } } n++ }
  END { printf "%d entries, %.0f MiB, %.1f s", n, b / 1048576, s }' "$2"; }
pushed=$(moved pushed "$work/runner-a.log")
pulled=$(moved pulled "$work/runner-b.log")
cmp -s "$work/runner-a/qemu-worker.raw" "$work/runner-b/qemu-worker.raw" || { echo "bench: runners A and B baked different raws" >&2; exit 1; }
rm -rf "$work"/cache-a "$work"/cache-b "$work"/runner-a "$work"/runner-b "$work/registry"
kill $reg_pid 2>/dev/null || true

# Warm: the first warm bake reads the trees that the runners' bakes dropped from the page cache.
t1=$(now)
$KILN bake images/qemu.yaml --role worker "${overlay[@]}" -o "$work/warm" 2> "$work/warm.log" >/dev/null
t2=$(now)
warm_first=$(secs "$t1" "$t2")

# The floor: mksquashfs alone on the warm bake's own root tree (read back from its root-a
# partition), with the bake's options. The warm bake against it in pairs, the floor then the
# bake, three times: this machine's speed drifts by tens of percent from one minute to the next,
# so the ratio is taken pair by pair and the medians are quoted.
read -r start size < <(python3 -c 'import json,sys
p=[p for p in json.load(open(sys.argv[1]))["disk"]["partitions"] if p["Name"] == "root-a"][0]
print(p["Start"], p["Size"])' "$work/warm/qemu-worker.json")
dd if="$work/warm/qemu-worker.raw" of="$work/root-a.squashfs" bs=1M iflag=skip_bytes,count_bytes \
  skip="$start" count="$size" status=none
unsquashfs -q -n -d "$work/tree" "$work/root-a.squashfs" >/dev/null
sync
squashfs_opts=(-no-progress -reproducible -mkfs-time 0 -all-time 0 -comp zstd -mem 256M -Xcompression-level 3 -quiet)
floors=() warms=() ratios=()
for i in 1 2 3; do
  t3=$(now)
  mksquashfs "$work/tree" "$work/floor.squashfs" -noappend "${squashfs_opts[@]}" >/dev/null
  t4=$(now)
  $KILN bake images/qemu.yaml --role worker "${overlay[@]}" -o "$work/warm-again" 2> "$work/warm-$i.log" >/dev/null
  t5=$(now)
  python3 -c 'import json,sys
raw = lambda f: [o["sha256"] for o in json.load(open(f))["outputs"] if o["file"].endswith(".raw")]
sys.exit(raw(sys.argv[1]) != raw(sys.argv[2]))' "$work/warm/qemu-worker.json" "$work/warm-again/qemu-worker.json" ||
    { echo "bench: warm bake $i baked another raw than the first warm bake" >&2; exit 1; }
  rm -rf "$work/warm-again"
  floors+=("$(secs "$t3" "$t4")") warms+=("$(secs "$t4" "$t5")")
  ratios+=("$(awk -v a="$t3" -v b="$t4" -v c="$t5" 'BEGIN { printf "%.2f", (c - b) / (b - a) }')")
done
median() { printf '%s\n' "$@" | sort -g | sed -n 2p; }
floor=$(median "${floors[@]}")
warm=$(median "${warms[@]}")
ratio=$(median "${ratios[@]}")
ratio_range=$(printf '%s\n' "${ratios[@]}" | sort -g | sed -n '1p;$p' | paste -sd-)

# Rebake after one artifact changes: crictl repacked with a later mtime (a new sha256, the same
# member), as a new release of one tool would arrive, through a second profile overlay.
crictl_sha=$(python3 -c 'import json,sys; print([a["sha256"] for a in json.load(open(sys.argv[1]))["artifacts"] if a["name"] == "crictl"][0])' "$work/warm/qemu-worker.json")
mkdir -p "$work/crictl"
tar -C "$work/crictl" -xzf "$KILN_CACHE/blobs/sha256/$crictl_sha" crictl
tar -C "$work/crictl" --mtime=@1700000000 --owner=0 --group=0 -czf "$work/crictl-changed.tar.gz" crictl
printf 'artifacts:\n  - name: crictl\n    path: crictl-changed.tar.gz\n    sha256: %s\n' \
  "$(sha256sum "$work/crictl-changed.tar.gz" | cut -d' ' -f1)" > "$work/changed.yaml"
t2=$(now)
$KILN bake images/qemu.yaml --role worker "${overlay[@]}" --profile-overlay "$work/changed.yaml" -o "$work/rebake" 2> "$work/rebake.log" >/dev/null
t3=$(now)
rebake=$(secs "$t2" "$t3")

# kiln from Debian's packages: the base made as make base makes it (mmdebstrap, then kiln base
# import), what mkosi's build from a cold package cache does before its own work.
t5=$(now)
images/base/build.sh "$work/base.tar" > "$work/base.log" 2>&1
$KILN base import "$work/base.tar" --layout "$work/base-layout" --tag bookworm >> "$work/base.log" 2>&1
t6=$(now)
base_build=$(secs "$t5" "$t6")
rm -rf "$work/base.tar" "$work/base-layout"

# mkosi building the same content (bench/mkosi.sh): Debian with the base's packages plus what
# kiln adds to the base (the warm tree against the flattened base in the cache, which the warm
# bake's log names).
base_tree=$(sed -n 's/.*msg="base \(tree linked from the cache\|flattened\)" tree=\([^ ]*\) .*/\2/p' "$work/warm.log")
[ -d "$base_tree" ] || { echo "bench: the warm bake kept no flattened base in the cache (see $work/warm.log)" >&2; exit 1; }
mkosi_out=$(bench/mkosi.sh "$work/tree" "$base_tree" "$work/mkosi" "${squashfs_opts[@]}")
mkosi_net=$(awk '$2 == "network" { print $3 }' <<<"$mkosi_out")
mkosi_cold=$(awk '$2 == "cold" { print $3 }' <<<"$mkosi_out")
mkosi_warm=$(awk '$2 == "warm" { print $3 }' <<<"$mkosi_out")

# The control plane's image too, for its size (seven pre-pulled images, every one ready in
# containerd's store).
$KILN bake images/qemu.yaml --role control-plane "${overlay[@]}" -o "$work/warm" 2> "$work/cp.log" >/dev/null

# Boots under TCG: first boot (creates /var) and second boot of the same disk.
cp --sparse=always "$work/warm/qemu-worker.raw" "$work/boot.raw"
boot() {
  local t0 t1
  t0=$(now)
  $KILN run "$work/boot.raw" --accel tcg --config "$work/cluster/bench-worker-1.ign" --until-firstboot --timeout 10m > "$work/boot$1.log" 2>&1
  t1=$(now)
  local guest
  guest=$(grep -a 'kiln-init: firstboot' "$work/boot$1.log" | tail -1 | sed -n 's/^\[ *\([0-9.]*\)\].*/\1/p')
  echo "$(secs "$t0" "$t1") ${guest:-?}"
}
read -r b1 g1 < <(boot 1)
read -r b2 g2 < <(boot 2)

raw=$work/warm/qemu-worker.raw
printf '\nkiln bench (worker image, %s, %s cores)\n' "$(uname -r)" "$(nproc)"
printf '  bake cold                     %6s s\n' "$cold"
printf '  bake, runner A pushing        %6s s   (%s pushed)\n' "$runner_a" "$pushed"
printf '  bake, runner B shared cache   %6s s   (%s pulled; same raw as A)\n' "$runner_b" "$pulled"
printf '  bake warm, first             %6s s   (its trees out of the page cache)\n' "$warm_first"
printf '  bake warm                     %6s s   (median of 3: %s)\n' "$warm" "${warms[*]}"
printf '  mksquashfs alone, same tree   %6s s   (median of 3: %s)\n' "$floor" "${floors[*]}"
printf '  warm bake / floor             %6s     (median of 3 pairs, %s)\n' "$ratio" "$ratio_range"
printf '  rebake, one artifact changed   %6s s\n' "$rebake"
printf '  base from packages (make base) %5s s   + kiln cold = %s s\n' "$base_build" "$(awk -v a="$base_build" -v b="$cold" 'BEGIN { printf "%.1f", a + b }')"
printf '  mkosi, packages downloaded    %6s s   / (base + kiln cold) = %s\n' "$mkosi_net" "$(awk -v a="$mkosi_net" -v b="$base_build" -v c="$cold" 'BEGIN { printf "%.1f", a / (b + c) }')"
printf '  mkosi, same content, cold     %6s s   / kiln cold = %s\n' "$mkosi_cold" "$(awk -v a="$mkosi_cold" -v b="$cold" 'BEGIN { printf "%.1f", a / b }')"
printf '  mkosi, same content, warm     %6s s   / kiln warm = %s\n' "$mkosi_warm" "$(awk -v a="$mkosi_warm" -v b="$warm" 'BEGIN { printf "%.1f", a / b }')"
grep -h 'seconds=' "$work/rebake.log" | sed -n 's/.*msg="\{0,1\}\([^"=]*\)"\{0,1\} .*seconds=\([0-9.]*\).*/    rebake step: \1 \2 s/p' | grep -v 'root filesystem made.*type' || true
peak() { sed -n 's/.*peak memory.*kiln_mib=\([0-9]*\).*largest_tool_mib=\([0-9]*\).*/\1 MiB kiln, \2 MiB largest tool/p' "$1" | tail -1; }
printf '  bake peak RSS                 cold: %s; warm: %s\n' "$(peak "$work/cold.log")" "$(peak "$work/warm.log")"
grep -h 'seconds=' "$work/warm-3.log" | sed -n 's/.*msg="\{0,1\}\([^"=]*\)"\{0,1\} .*seconds=\([0-9.]*\).*/    warm step: \1 \2 s/p' | grep -v 'root filesystem made.*type' || true
printf '  first boot to status line     %6s s wall (guest clock %s s)\n' "$b1" "$g1"
printf '  second boot to status line    %6s s wall (guest clock %s s)\n' "$b2" "$g2"
printf '  raw                           %6s MiB apparent, %s MiB allocated\n' "$(( $(stat -c %s "$raw") >> 20 ))" "$(( $(stat -c %b "$raw") * 512 >> 20 ))"
printf '  qcow2                         %6s MiB\n' "$(( $(stat -c %s "$work/warm/qemu-worker.qcow2") >> 20 ))"
cp_raw=$work/warm/qemu-control-plane.raw
printf '  control plane raw             %6s MiB allocated, qcow2 %s MiB, %s\n' "$(( $(stat -c %b "$cp_raw") * 512 >> 20 ))" \
  "$(( $(stat -c %s "$work/warm/qemu-control-plane.qcow2") >> 20 ))" \
  "$(python3 -c 'import json,sys; i=json.load(open(sys.argv[1]))["kubernetes"]["images"]; print(len(i), "images,", sum(1 for x in i if x.get("unpacked")), "ready in the store")' "$work/warm/qemu-control-plane.json")"
printf '  root squashfs (same tree)     %6s MiB\n' "$(( $(stat -c %s "$work/floor.squashfs") >> 20 ))"

# First boot: kiln-firstboot against cloud-init doing the same writes, user and unit, in two
# images that differ only in which agent is enabled (bench/kiln.yaml, bench/cloudinit.yaml),
# each reading its config from a CIDATA ISO, same QEMU settings. The durations are systemd's own
# timestamps, printed on the console by kiln-bench-report.service.
fb=$work/firstboot
mkdir -p "$fb/kiln" "$fb/cloudinit"
for d in kiln cloudinit; do
  $KILN lock --update bench/$d.yaml >/dev/null
  $KILN bake bench/$d.yaml --role worker -o "$fb" 2>>"$fb/bake.log" >/dev/null
done
cp bench/firstboot/user-data.ign "$fb/kiln/user-data"
cp bench/firstboot/user-data.cloud-config "$fb/cloudinit/user-data"
for d in kiln cloudinit; do
  printf 'instance-id: kiln-bench\nlocal-hostname: bench\n' > "$fb/$d/meta-data"
  genisoimage -quiet -V cidata -J -r -o "$fb/$d.iso" "$fb/$d"
done
agent() { # image iso log
  $KILN run "$1" --accel tcg --disk "cidata=$2" --until 'kiln-bench: done' --timeout 15m > "$3" 2>&1
  grep -a 'kiln-probe: source=bench uid=' "$3" >/dev/null || { echo "bench: $1: the config was not applied (see $3)" >&2; return 1; }
}
agent "$fb/bench-kiln-worker.raw" "$fb/kiln.iso" "$fb/kiln.log"
agent "$fb/bench-cloudinit-worker.raw" "$fb/cloudinit.iso" "$fb/cloudinit.log"
span() { # log units… → milliseconds from the first start to the last end
  local log=$1; shift
  grep -a 'kiln-bench: unit=' "$log" | tr -d '\r' | awk -v units=" $* " '
    { split($0, a, "unit="); split(a[2], f, " "); u = f[1]
      if (index(units, " " u " ") == 0) next
      split(f[2], s, "="); split(f[3], e, "=")
      if (s[2] > 0 && (min == "" || s[2] < min)) min = s[2]
      if (e[2] > max) max = e[2] }
    END { if (min == "" || max == "") print "?"; else printf "%.0f", (max - min) / 1000 }'
}
kiln_ms=$(span "$fb/kiln.log" kiln-firstboot)
ci_ms=$(span "$fb/cloudinit.log" cloud-init-local cloud-init cloud-config cloud-final)
printf '  first boot: kiln-firstboot    %6s ms (systemd timestamps, TCG)\n' "$kiln_ms"
printf '  first boot: cloud-init        %6s ms (cloud-init-local start to cloud-final end)\n' "$ci_ms"
awk -v k="$kiln_ms" -v c="$ci_ms" 'BEGIN { if (k > 0 && c > 0) printf "  cloud-init / kiln-firstboot   %6.1f x\n", c / k }'

# kiln serve: 500 clients on loopback, each fetching the chain script, its own script, a
# 10 MiB kernel and a 60 MiB initramfs (KILN_PXE_DIR: a real bake's pxe output instead).
${GO:-go} run ./bench/serve -kiln "$KILN"
rm -rf "$work"
