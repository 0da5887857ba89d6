#!/usr/bin/env bash
# build-components.sh builds, from source through the Go module proxy, every
# pinned component the end-to-end cluster needs, and caches the
# results outside the repository:
#
#   $KILN_E2E_CACHE/bin/<name>      static binaries
#   $KILN_E2E_CACHE/rootfs/iptables userland for the kube-proxy image (Debian .debs)
#
# Arguments name components (functions below) or the group docker; none builds
# every component but Docker's.
#
# Each component is skipped when its binaries exist (delete the file to
# rebuild). Versions are the ones the e2e profile pins.
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-v1.37.2}
ETCD_VERSION=${ETCD_VERSION:-v3.6.16}
CONTAINERD_VERSION=${CONTAINERD_VERSION:-v2.4.2}
RUNC_VERSION=${RUNC_VERSION:-v1.5.3}
CRICTL_VERSION=${CRICTL_VERSION:-v1.37.0}
CNI_VERSION=${CNI_VERSION:-v1.10.0}
COREDNS_VERSION=${COREDNS_VERSION:-v1.15.0}
# Docker Engine is the moby/moby/v2 module (the daemon and docker-proxy; it has
# a go.mod), the CLI the docker/cli module (GOPATH-era: its dependencies are
# listed in vendor.mod, used as its go.mod), cri-dockerd the Mirantis module built as the
# main module (its go.mod replaces Kubernetes' staging modules).
MOBY_VERSION=${MOBY_VERSION:-v2.0.0-beta.24}
DOCKER_CLI_VERSION=${DOCKER_CLI_VERSION:-v29.9.0}
CRI_DOCKERD_VERSION=${CRI_DOCKERD_VERSION:-v0.3.17}

CACHE=${KILN_E2E_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kiln/e2e}
BIN=$CACHE/bin
SRC=$CACHE/src
mkdir -p "$BIN" "$SRC"
export GOFLAGS=-mod=mod
export GOBIN=$BIN

log() { printf '%s build-components: %s\n' "$(date +%T)" "$*" >&2; }
have() { for f in "$@"; do [ -x "$BIN/$f" ] || return 1; done; }
timed() { local name=$1; shift; local t0=$SECONDS; "$@"; log "$name built in $((SECONDS - t0)) s"; }

# k8s_module prepares $SRC/kubernetes: a module requiring k8s.io/kubernetes at $K8S_VERSION with
# its staging repos replaced by their published versions (made again when it requires another
# version), and prints the -ldflags that stamp the version.
k8s_module() {
	local d=$SRC/kubernetes
	if ! grep -qswF "k8s.io/kubernetes $K8S_VERSION" "$d/go.mod" || [ ! -f "$d/go.sum" ]; then
		rm -rf "$d" && mkdir -p "$d" && cd "$d"
		cat >go.mod <<MOD
module kiln.local/k8s-build

go 1.26
MOD
		go mod edit -require=k8s.io/kubernetes@"$K8S_VERSION"
		# k8s.io/kubernetes replaces its staging repos with ./staging; a module
		# that requires it has to name the published versions itself.
		local modfile
		modfile=$(go mod download -json k8s.io/kubernetes@"$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
		grep '=> ./staging' "$modfile" | awk '{print $1}' | grep -v -e sample-cli-plugin -e sample-controller |
			while read -r m; do go mod edit -replace="$m=$m@v0.${K8S_VERSION#v1.}"; done
		local t tools=()
		for t in kubelet kube-apiserver kube-controller-manager kube-scheduler kube-proxy kubectl kubeadm; do
			tools+=(-tool=k8s.io/kubernetes/cmd/$t)
		done
		go mod edit "${tools[@]}"
		go mod tidy >/dev/null 2>&1 || true
	fi
	local minor=${K8S_VERSION#v1.} date p ld="-s -w"
	date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
	for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		ld="$ld -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=${minor%%.*} -X $p.gitTreeState=clean -X $p.buildDate=$date"
	done
	echo "$ld"
}

# k8s_build builds commands of k8s.io/kubernetes/cmd into $BIN.
k8s_build() {
	local ld c pkgs=()
	ld=$(k8s_module)
	for c in "$@"; do pkgs+=(k8s.io/kubernetes/cmd/$c); done
	(cd "$SRC/kubernetes" && CGO_ENABLED=0 go build -trimpath -ldflags "$ld" -o "$BIN/" "${pkgs[@]}")
}

k8s() {
	have kubelet kube-apiserver kube-controller-manager kube-scheduler kube-proxy kubectl && return
	k8s_build kubelet kube-apiserver kube-controller-manager kube-scheduler kube-proxy kubectl
}

# kubeadm is not part of a kiln node: make bench-ready's reference nodes install it at boot.
kubeadm() {
	have kubeadm && return
	k8s_build kubeadm
}

pause() {
	have pause && return
	local dir
	dir=$(go mod download -json k8s.io/kubernetes@"$K8S_VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
	gcc -Os -static -DVERSION="${K8S_VERSION}" -o "$BIN/pause" "$dir/build/pause/linux/pause.c"
	strip "$BIN/pause"
}

etcd() {
	have etcd etcdctl && return
	local d=$SRC/etcd
	rm -rf "$d" && mkdir -p "$d" && cd "$d"
	cat >go.mod <<MOD
module kiln.local/etcd-build

go 1.26
MOD
	cat >main.go <<'GO'
// Command etcd is etcd's own server main, built from the published module.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
	go get go.etcd.io/etcd/server/v3@"$ETCD_VERSION" go.etcd.io/etcd/etcdctl/v3@"$ETCD_VERSION" >/dev/null
	go mod edit -tool=go.etcd.io/etcd/etcdctl/v3
	go mod tidy >/dev/null
	CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$BIN/etcd" .
	CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$BIN/etcdctl" go.etcd.io/etcd/etcdctl/v3
}

containerd() {
	have containerd containerd-shim-runc-v2 ctr && return
	local tags="urfave_cli_no_docs no_btrfs osusergo netgo static_build"
	local ld="-s -w -X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION"
	CGO_ENABLED=0 go install -trimpath -tags "$tags" -ldflags "$ld" \
		github.com/containerd/containerd/v2/cmd/containerd@"$CONTAINERD_VERSION" \
		github.com/containerd/containerd/v2/cmd/ctr@"$CONTAINERD_VERSION"
	CGO_ENABLED=0 go install -trimpath -tags "$tags no_grpc" -ldflags "$ld" \
		github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@"$CONTAINERD_VERSION"
}

runc() {
	have runc && return
	# runc needs cgo and libseccomp; the static library comes from Debian's
	# libseccomp-dev, unpacked rather than installed.
	local d=$SRC/seccomp
	rm -rf "$d" && mkdir -p "$d" && (cd "$d" && apt-get download libseccomp-dev >/dev/null && dpkg-deb -x libseccomp-dev_*.deb root)
	local pc=$d/root/usr/lib/x86_64-linux-gnu/pkgconfig
	sed -i "s|^prefix=.*|prefix=$d/root/usr|" "$pc/libseccomp.pc"
	PKG_CONFIG_PATH=$pc CGO_ENABLED=1 CGO_CFLAGS="-I$d/root/usr/include" CGO_LDFLAGS="-L$d/root/usr/lib/x86_64-linux-gnu" \
		go install -trimpath -tags "seccomp urfave_cli_no_docs" \
		-ldflags "-s -w -linkmode external -extldflags -static -X main.version=${RUNC_VERSION#v}" \
		github.com/opencontainers/runc@"$RUNC_VERSION"
}

crictl() {
	have crictl && return
	CGO_ENABLED=0 go install -trimpath -ldflags "-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=$CRICTL_VERSION" \
		sigs.k8s.io/cri-tools/cmd/crictl@"$CRICTL_VERSION"
}

cni() {
	have bridge host-local loopback portmap && return
	CGO_ENABLED=0 go install -trimpath -ldflags "-s -w" \
		github.com/containernetworking/plugins/plugins/main/bridge@"$CNI_VERSION" \
		github.com/containernetworking/plugins/plugins/ipam/host-local@"$CNI_VERSION" \
		github.com/containernetworking/plugins/plugins/main/loopback@"$CNI_VERSION" \
		github.com/containernetworking/plugins/plugins/meta/portmap@"$CNI_VERSION"
}

coredns() {
	have coredns && return
	CGO_ENABLED=0 go install -trimpath -ldflags "-s -w" github.com/coredns/coredns@"$COREDNS_VERSION"
}

docker_engine() {
	have dockerd docker-proxy && return
	local ld="-s -w -X github.com/moby/moby/v2/dockerversion.Version=${MOBY_VERSION#v}"
	ld="$ld -X github.com/moby/moby/v2/dockerversion.GitCommit=$MOBY_VERSION"
	CGO_ENABLED=0 go install -trimpath -tags "netgo osusergo static_build nri_no_wasm exclude_graphdriver_btrfs" \
		-ldflags "$ld" github.com/moby/moby/v2/cmd/dockerd@"$MOBY_VERSION" \
		github.com/moby/moby/v2/cmd/docker-proxy@"$MOBY_VERSION"
}

# module_src copies module $1@$2 from the module cache into $SRC/$3, writable.
module_src() {
	local dir d=$SRC/$3
	dir=$(go mod download -json "$1@$2" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
	rm -rf "$d" && cp -r "$dir" "$d" && chmod -R u+w "$d"
	echo "$d"
}

docker_cli() {
	have docker && return
	local d
	d=$(module_src github.com/docker/cli "$DOCKER_CLI_VERSION+incompatible" docker-cli)
	# The module zip keeps only vendor/modules.txt: the dependencies come from the proxy,
	# at the versions vendor.mod names (vendor.sum checks them).
	cd "$d" && rm -rf vendor && mv vendor.mod go.mod && mv vendor.sum go.sum
	CGO_ENABLED=0 go build -trimpath -tags "osusergo netgo" \
		-ldflags "-s -w -X github.com/docker/cli/cli/version.Version=${DOCKER_CLI_VERSION#v} -X github.com/docker/cli/cli/version.GitCommit=$DOCKER_CLI_VERSION" \
		-o "$BIN/docker" ./cmd/docker
}

cri_dockerd() {
	have cri-dockerd && return
	local d
	d=$(module_src github.com/Mirantis/cri-dockerd "$CRI_DOCKERD_VERSION" cri-dockerd)
	cd "$d"
	# Without -trimpath: built as the main module from a copy, its build information names no
	# module version, and only then does it keep the -ldflags the bake reads the version from.
	CGO_ENABLED=0 go build \
		-ldflags "-s -w -X github.com/Mirantis/cri-dockerd/cmd/version.Version=${CRI_DOCKERD_VERSION#v} -X github.com/Mirantis/cri-dockerd/cmd/version.GitCommit=$CRI_DOCKERD_VERSION" \
		-o "$BIN/cri-dockerd" .
}

iptables_root() {
	# kube-proxy execs iptables/nft: its image carries Debian's userland.
	local r=$CACHE/rootfs/iptables
	[ -x "$r/usr/sbin/xtables-nft-multi" ] && return
	local d=$SRC/iptables-debs
	rm -rf "$d" "$r" && mkdir -p "$d" "$r"
	(cd "$d" && apt-get download libc6 libgcc-s1 iptables libxtables12 libip4tc2 libip6tc2 libnftnl11 libmnl0 \
		libnetfilter-conntrack3 libnfnetlink0 conntrack libnftables1 nftables libjansson4 libedit2 libbsd0 libmd0 \
		libtinfo6 libgmp10 libxtables12 >/dev/null)
	for f in "$d"/*.deb; do dpkg-deb -x "$f" "$r"; done
	rm -rf "$r"/usr/share/{doc,man,locale,info,lintian}
	for t in iptables iptables-save iptables-restore ip6tables ip6tables-save ip6tables-restore; do
		ln -sf xtables-nft-multi "$r/usr/sbin/$t"
	done
}

all=(k8s pause etcd containerd runc crictl cni coredns iptables_root)
# kubeadm only for the boot-to-Ready comparison (make bench-ready): build-components.sh kubeadm.
# Docker Engine, its CLI and cri-dockerd only for a worker on Docker (make e2e RUNTIME=docker):
# build-components.sh docker.
docker=(docker_engine docker_cli cri_dockerd)
args=("$@")
[ ${#args[@]} -gt 0 ] || args=("${all[@]}")
components=()
for c in "${args[@]}"; do
	if [ "$c" = docker ]; then components+=("${docker[@]}"); else components+=("$c"); fi
done
for c in "${components[@]}"; do
	log "$c"
	(timed "$c" "$c")
done
log "done: $(du -sh "$BIN" | cut -f1) in $BIN"
