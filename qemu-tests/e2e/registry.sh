#!/usr/bin/env bash
# registry.sh starts a plain-HTTP container registry on 127.0.0.1 for the
# end-to-end cluster: Debian's docker-registry (distribution 2.8), installed
# with apt-get when missing, storing its blobs under the e2e cache so images
# pushed once survive between runs.
#
#   registry.sh [start]   start it (nothing to do when /v2/ already answers)
#   registry.sh stop      stop the one this script started
#
# Environment: KILN_REGISTRY_ADDR (default 127.0.0.1:5000), KILN_E2E_CACHE
# (default ~/.cache/kiln/e2e; storage in $KILN_E2E_CACHE/registry, config,
# log and pid file in $KILN_E2E_CACHE/registry-run).
set -euo pipefail

ADDR=${KILN_REGISTRY_ADDR:-127.0.0.1:5000}
CACHE=${KILN_E2E_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kiln/e2e}
STORE=$CACHE/registry
RUN=$CACHE/registry-run
BIN=/usr/bin/docker-registry

log() { printf '%s registry: %s\n' "$(date +%T)" "$*" >&2; }

# answers is true when a registry serves the v2 API at $ADDR.
answers() {
	local code
	code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "http://$ADDR/v2/" 2>/dev/null) || return 1
	[ "$code" = 200 ]
}

stop() {
	[ -f "$RUN/pid" ] || { log "not started by this script ($RUN/pid missing)"; return 0; }
	local pid
	pid=$(cat "$RUN/pid")
	if kill "$pid" 2>/dev/null; then
		for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
		log "stopped pid $pid"
	fi
	rm -f "$RUN/pid"
}

start() {
	if answers; then
		log "already serving http://$ADDR/v2/"
		return 0
	fi
	if [ ! -x "$BIN" ]; then
		log "installing docker-registry (apt-get)"
		# The package's own service (all interfaces, htpasswd auth) is not
		# wanted: keep invoke-rc.d from starting it where an init system runs.
		DEBIAN_FRONTEND=noninteractive RUNLEVEL=1 apt-get install -y --no-install-recommends docker-registry >/dev/null
		if command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
			systemctl disable --now docker-registry.service >/dev/null 2>&1 || true
		fi
	fi
	mkdir -p "$STORE" "$RUN"
	cat >"$RUN/config.yml" <<EOF
version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: $STORE
  delete:
    enabled: true
http:
  addr: $ADDR
EOF
	# setsid: the registry outlives this script and the caller's terminal. It keeps none of
	# the caller's other descriptors either: an inherited lock or pipe would stay held (a
	# flock(1) lock, a test runner waiting for its output to close) as long as it runs.
	(
		for fd in /proc/$BASHPID/fd/*; do
			fd=${fd##*/}
			if [ "$fd" -gt 2 ]; then eval "exec $fd>&-"; fi
		done
		exec setsid "$BIN" serve "$RUN/config.yml" >"$RUN/registry.log" 2>&1 </dev/null
	) &
	local pid=$!
	echo "$pid" >"$RUN/pid"
	for _ in $(seq 100); do
		if answers; then
			log "serving http://$ADDR/v2/ (pid $pid, storage $STORE)"
			return 0
		fi
		if ! kill -0 "$pid" 2>/dev/null; then
			rm -f "$RUN/pid"
			log "docker-registry exited:"
			tail -n 20 "$RUN/registry.log" >&2
			return 1
		fi
		sleep 0.1
	done
	log "no answer from http://$ADDR/v2/ after 10 s; log:"
	tail -n 20 "$RUN/registry.log" >&2
	return 1
}

case ${1:-start} in
start) start ;;
stop) stop ;;
*)
	echo "usage: $0 [start|stop]" >&2
	exit 2
	;;
esac
