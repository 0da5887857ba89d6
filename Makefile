# kiln — see README.md. `make image` bakes and boots the default image; `make test` runs every test.
SHELL := /bin/bash
GO ?= go
export KILN_CACHE ?= $(HOME)/.cache/kiln
VERSION := $(shell git describe --always --dirty 2>/dev/null || echo dev)
ROLE ?= worker
DEF ?= images/qemu.yaml
OUT ?= out
RUNTIME ?= containerd
BASE := $(KILN_CACHE)/base/index.json

.PHONY: all build deps base base-generic base-cloudinit lock bake image run test test-unit e2e e2e-import e2e-pull e2e-ha e2e-update components etcd-component local-sources bench bench-ready bench-idle bench-serve fuzz vet clean

all: build

build: bin/kiln bin/kiln-init bin/kiln-stage1

bin/kiln: FORCE
	$(GO) build -ldflags "-X main.version=$(VERSION)" -o $@ ./builder/cmd/kiln

# kiln-init is the node agent on the image's root, kiln-stage1 the initramfs' /init (PID 1):
# both static, no cgo.
bin/kiln-init: FORCE
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-s -w -X main.version=$(VERSION)" -o $@ ./initd/cmd/kiln-init

bin/kiln-stage1: FORCE
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-s -w -X main.version=$(VERSION)" -o $@ ./initd/cmd/kiln-stage1

deps:
	@builder/scripts/deps.sh

# The default base OS (Debian bookworm, images/base/) as an OCI image in $(KILN_CACHE)/base.
# Rebuilt only when its recipe changes.
base: $(BASE)
$(BASE): images/base/build.sh images/base/customize.sh images/base/packages | bin/kiln
	@builder/scripts/deps.sh
	@mkdir -p $(KILN_CACHE)
	images/base/build.sh $(KILN_CACHE)/base.tar
	bin/kiln base import $(KILN_CACHE)/base.tar --layout $(KILN_CACHE)/base --tag bookworm
	rm -f $(KILN_CACHE)/base.tar
	@touch $@

# The same base with Debian's generic kernel (linux-image-amd64: drivers and filesystems as
# modules) instead of the cloud one; make test bakes and boots an image from it.
BASE_GENERIC := $(KILN_CACHE)/base/.bookworm-generic
base-generic: $(BASE_GENERIC)
$(BASE_GENERIC): images/base/build.sh images/base/customize.sh images/base/packages | bin/kiln $(BASE)
	@mkdir -p $(KILN_CACHE)
	KILN_BASE_KERNEL=linux-image-amd64 images/base/build.sh $(KILN_CACHE)/base-generic.tar
	bin/kiln base import $(KILN_CACHE)/base-generic.tar --layout $(KILN_CACHE)/base --tag bookworm-generic
	rm -f $(KILN_CACHE)/base-generic.tar
	@touch $@

# The same base plus cloud-init, for make bench's first-boot comparison; make test bakes its two
# images (qemu-tests/bench_test.go) so that a base with cloud-init keeps baking.
BASE_CLOUDINIT := $(KILN_CACHE)/base/.bookworm-cloudinit
base-cloudinit: $(BASE_CLOUDINIT)
$(BASE_CLOUDINIT): images/base/build.sh images/base/customize.sh images/base/packages | bin/kiln $(BASE)
	@mkdir -p $(KILN_CACHE)
	KILN_BASE_EXTRA_PACKAGES=cloud-init images/base/build.sh $(KILN_CACHE)/base-cloudinit.tar
	bin/kiln base import $(KILN_CACHE)/base-cloudinit.tar --layout $(KILN_CACHE)/base --tag bookworm-cloudinit
	rm -f $(KILN_CACHE)/base-cloudinit.tar
	@touch $@

# The profiles pin upstream release files and images (dl.k8s.io, GitHub, registry.k8s.io). With
# UPSTREAM=1 the bake fetches those; by default (this machine reaches only the Go module proxy
# and Debian) it bakes the same profiles through a profile overlay pointing at the components
# built from source by make components and pushed to a local registry (as make e2e does).
export KILN_E2E_CACHE ?= $(KILN_CACHE)/e2e
LOCAL_OVERLAY := $(KILN_E2E_CACHE)/local.yaml
ifeq ($(UPSTREAM),1)
OVERLAY_FLAG :=
SOURCES :=
else
OVERLAY_FLAG := --profile-overlay $(LOCAL_OVERLAY)
SOURCES := local-sources
endif

components:
	qemu-tests/e2e/build-components.sh

# The etcd the profiles pin, built from source into $(KILN_E2E_CACHE)/bin (cached): make test
# runs three of it for initd/etcdmember's tests.
etcd-component:
	qemu-tests/e2e/build-components.sh etcd

local-sources: deps components
	@builder/scripts/deps.sh e2e
	qemu-tests/e2e/registry.sh start
	$(GO) run ./qemu-tests/e2e/images -registry 127.0.0.1:5000 -artifacts $(KILN_E2E_CACHE)/artifacts \
		-overlay $(LOCAL_OVERLAY) >/dev/null

lock: build base $(SOURCES)
	bin/kiln lock --update $(DEF) $(OVERLAY_FLAG)

bake: deps lock
	bin/kiln bake $(DEF) --role $(ROLE) $(OVERLAY_FLAG) -o $(OUT)

# A one-node cluster's config for make image (the API endpoint is QEMU user networking's
# guest address; its control plane runs emulated there: --slow-control-plane).
$(OUT)/cluster/demo-cp-1.ign: | bin/kiln
	bin/kiln cluster init --name demo --dns-zone kiln.test --control-planes 1 --workers 1 \
		--api-endpoint 10.0.2.15:6443 --slow-control-plane -o $(OUT)/cluster

# Bake the control-plane image and boot it once with its etcd disk (the image stays pristine:
# --snapshot), printing the serial console up to kiln-init's first-boot status line. Run it
# without --until-firstboot and with --forward 6443:6443 to watch the node become Ready
# (kubectl --kubeconfig out/cluster/admin.conf --server https://127.0.0.1:6443 --tls-server-name kubernetes).
image: ROLE = control-plane
image: bake $(OUT)/cluster/demo-cp-1.ign
	bin/kiln run $(OUT)/$(basename $(notdir $(DEF)))-control-plane.qcow2 --snapshot \
		--config $(OUT)/cluster/demo-cp-1.ign --disk etcd-main=2G --until-firstboot

# Every test, the QEMU boot tests included (TCG; they need the bases, so they are built first;
# initd/etcdmember runs three etcd processes of the pinned version).
# -v: the boot tests log their timings; the output ends with what failed, if anything did.
test: deps build base base-generic base-cloudinit etcd-component
	@builder/scripts/deps.sh test
	set -o pipefail; KILN_INIT=$(CURDIR)/bin/kiln-init KILN_QEMU_TESTS=1 KILN_ACCEL=tcg \
		$(GO) test -count=1 -v -timeout 60m ./... 2>&1 | builder/scripts/test-summary.sh

# The offline end-to-end cluster (docs/testing.md, "End to end"): Kubernetes, etcd, containerd, runc, CNI,
# crictl and CoreDNS built from source through the Go module proxy (cached in
# $(KILN_E2E_CACHE)), images pushed to a local registry, control-plane and worker images baked and
# booted under TCG; kubectl from the host checks /readyz, both nodes Ready and a pod on the worker.
# RUNTIME=docker: the worker is baked from images/qemu-docker.yaml (Docker Engine and cri-dockerd,
# built from source too) and docker ps on it must show the pod's containers.
e2e: deps build base
	@builder/scripts/deps.sh test
	@builder/scripts/deps.sh e2e
	KILN_INIT=$(CURDIR)/bin/kiln-init KILN_QEMU_TESTS=1 KILN_E2E=1 KILN_E2E_RUNTIME=$(RUNTIME) KILN_ACCEL=tcg \
		$(GO) test -count=1 -v -timeout 75m -run '^TestE2ECluster$$' ./qemu-tests/

# The same cluster baked --import-images: containerd's store is not laid at bake and first boot
# imports every image from the layout; what laying the store saves (docs/testing.md, "End to end").
e2e-import: deps build base
	@builder/scripts/deps.sh test
	@builder/scripts/deps.sh e2e
	KILN_INIT=$(CURDIR)/bin/kiln-init KILN_QEMU_TESTS=1 KILN_E2E=1 KILN_E2E_IMPORT=1 KILN_ACCEL=tcg \
		$(GO) test -count=1 -v -timeout 75m -run '^TestE2ECluster$$' ./qemu-tests/

# The same cluster baked --without-images, the nodes pulling every image from the local
# registry through a containerd mirror: what pre-pulling saves (docs/testing.md, "End to end").
e2e-pull: deps build base
	@builder/scripts/deps.sh test
	@builder/scripts/deps.sh e2e
	KILN_INIT=$(CURDIR)/bin/kiln-init KILN_QEMU_TESTS=1 KILN_E2E_PULL=1 KILN_ACCEL=tcg \
		$(GO) test -count=1 -v -timeout 75m -run 'TestE2EClusterWithoutImages' ./qemu-tests/

# The highly available cluster brought up by kiln cluster up from the e2e's images under TCG
# (docs/testing.md, "End to end"): SHAPE=external (default) — three etcd nodes, each with its etcd disk,
# one control plane and a worker; SHAPE=stacked — three control planes (1 vCPU, each with its
# etcd member and disk) and a worker. etcd's members (etcdctl), every node Ready, a Deployment;
# a member powered off and started again, one replaced with a blank etcd disk, a power cut of
# every VM. KILN_E2E_HA_IMAGES=DIR reuses baked qemu-control-plane, -worker and -etcd images.
SHAPE ?= external
e2e-ha: deps build base
	@builder/scripts/deps.sh test
	@builder/scripts/deps.sh e2e
	KILN_INIT=$(CURDIR)/bin/kiln-init KILN_QEMU_TESTS=1 KILN_E2E_HA=1 KILN_E2E_HA_SHAPE=$(SHAPE) KILN_ACCEL=tcg \
		$(GO) test -count=1 -v -timeout 300m -run '^TestE2EHA$$' ./qemu-tests/

# The rolling update (docs/updates.md, "A cluster"): kiln cluster up --ssh-key with the e2e's
# control plane and worker, a v2 of both baked into another directory, kiln cluster update rolling
# the control plane (its etcd member kept) and then the worker; both on v2 from slot b, Ready.
e2e-update: deps build base
	@builder/scripts/deps.sh test
	@builder/scripts/deps.sh e2e
	KILN_INIT=$(CURDIR)/bin/kiln-init KILN_QEMU_TESTS=1 KILN_E2E_UPDATE=1 KILN_ACCEL=tcg \
		$(GO) test -count=1 -v -timeout 120m -run '^TestE2EUpdate$$' ./qemu-tests/

# What an idle cluster costs this host under TCG (bench/idle.sh): each VM's CPU and memory
# 13 minutes after power-on, per component. SHAPE=stacked (one control plane and a worker,
# default) or external (three etcd nodes too); the images of make bake (ROLE=control-plane,
# worker, etcd) in $(OUT).
bench-idle: SHAPE = stacked
bench-idle: build
	bench/idle.sh $(SHAPE) $(OUT)

test-unit:
	$(GO) test -short ./...

vet:
	$(GO) vet ./...
	@test -z "$$(gofmt -l builder initd qemu-tests)" || (gofmt -l builder initd qemu-tests; exit 1)

bench: deps build base base-cloudinit $(SOURCES)
	@builder/scripts/deps.sh test
	@builder/scripts/deps.sh bench
	KILN_PROFILE_OVERLAY=$(if $(SOURCES),$(LOCAL_OVERLAY)) bench/bench.sh
	KILN_PROFILE_OVERLAY=$(if $(SOURCES),$(LOCAL_OVERLAY)) bench/stage1.sh
	$(MAKE) --no-print-directory bench-ready

# Boot-to-Ready side by side (make bench runs it too): the e2e's kiln control plane and worker,
# then the same cluster the usual way — the cloud-init image of bench/cloudinit.yaml installing
# containerd, kubelet and kubeadm (built from source) from an HTTP mirror at boot and running
# kubeadm init / join with images from the local registry. Same VM sizes, TCG; a table at the end.
bench-ready: deps build base base-cloudinit
	@builder/scripts/deps.sh test
	@builder/scripts/deps.sh e2e
	KILN_INIT=$(CURDIR)/bin/kiln-init KILN_QEMU_TESTS=1 KILN_BENCH_READY=1 KILN_ACCEL=tcg \
		$(GO) test -count=1 -v -timeout 90m -run '^TestBenchReady$$' ./qemu-tests/

# kiln serve under load on loopback (bench/serve; make bench runs it too): 500 clients each
# fetching what a network boot fetches; requests/s, p99 per route, errors, the server's RSS.
# KILN_PXE_DIR=out serves a real bake's pxe output instead of generated files.
bench-serve: bin/kiln
	$(GO) run ./bench/serve -kiln bin/kiln

clean:
	rm -rf bin $(OUT)

FORCE:
