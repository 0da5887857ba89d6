#!/usr/bin/env bash
# test-summary.sh: passes `go test -v` output through unchanged and, when anything failed, ends it
# with what failed: each --- FAIL line with the last lines its test logged (file.go:N: ...), each
# failed package, a panic or a timeout. A run of ./... prints thousands of lines, and the cause of
# a failure is otherwise far above its last ones. It never changes the exit status: the caller's
# pipefail gives go test's.
#   go test -v ./... 2>&1 | builder/scripts/test-summary.sh
set -uo pipefail
exec awk -v keep=3 -v width=400 '
function cut(s) { return length(s) > width ? substr(s, 1, width) " ..." : s }
{ print; fflush() }
/^=== (RUN|CONT|NAME|PAUSE) / { cur = $3; next }
# A test logs "    file.go:N: message"; keep its last few such lines.
cur != "" && /^[[:space:]]+[^[:space:]]+\.go:[0-9]+: / {
	n[cur]++
	logged[cur, n[cur] % keep] = cut($0)
	next
}
/^[[:space:]]*--- FAIL: / { nf++; fail[nf] = $0; failed[nf] = $3; next }
# The last line of a package ("ok", "FAIL" or "?" and its path) names the package of the failures above it.
/^(ok|FAIL|\?)[[:space:]]+[^[:space:]]+/ {
	for (i = named + 1; i <= nf; i++) in_pkg[i] = $2
	named = nf
	if ($1 == "FAIL") { npkg++; pkg[npkg] = $0 }
	next
}
/^panic: / { npanic++; panics[npanic] = cut($0); next }
END {
	if (nf + npkg + npanic == 0) exit 0
	print ""
	print "=== what failed (the whole output is above) ==="
	for (i = 1; i <= nf; i++) {
		print fail[i] (in_pkg[i] != "" ? "  in " in_pkg[i] : "")
		t = failed[i]
		start = n[t] > keep ? n[t] - keep + 1 : 1
		for (j = start; j <= n[t]; j++) print "    " logged[t, j % keep]
	}
	for (i = 1; i <= npanic; i++) print panics[i]
	for (i = 1; i <= npkg; i++) print pkg[i]
}
'
