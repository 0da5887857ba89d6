package nodeimage

import (
	"fmt"
	"regexp"
	"strings"
	"time"
)

// StatusLinePrefix starts the one console line in which first boot reports its outcome.
const StatusLinePrefix = "kiln-init: firstboot "

// Outcomes a status line reports.
const (
	OutcomeOK     = "ok"
	OutcomeFailed = "failed"
	// OutcomeDone is a later boot's line: an earlier first boot succeeded.
	OutcomeDone = "done already"
)

// StatusLineRE matches a status line anywhere in a console line; its first group is the
// outcome.
var StatusLineRE = regexp.MustCompile(regexp.QuoteMeta(StatusLinePrefix) + `(ok|failed|done already)`)

// FormatOK is the status line of a successful first boot, e.g.
// "kiln-init: firstboot ok source=fw_cfg files=2 tasks=3 applied=3 unchanged=0 failed=0 duration=35ms".
func FormatOK(source string, files int, tasks string, took time.Duration) string {
	return fmt.Sprintf("%s%s source=%s files=%d %s duration=%s", StatusLinePrefix, OutcomeOK, source, files, tasks, took)
}

// FormatFailed is the status line of a failed first boot; reason must be one line.
func FormatFailed(reason string) string {
	return StatusLinePrefix + OutcomeFailed + ": " + reason
}

// FormatDone is a later boot's status line, naming when the first boot finished.
func FormatDone(finished time.Time) string {
	return fmt.Sprintf("%s%s (%s)", StatusLinePrefix, OutcomeDone, finished.Format(time.RFC3339))
}

// StatusLine is a status line found on the console.
type StatusLine struct {
	// Outcome is OutcomeOK, OutcomeFailed or OutcomeDone.
	Outcome string
	// Detail is the rest of the line: the counts, the failure, or when first boot finished.
	Detail string
}

// ParseStatusLine finds the status line in a console line (which may carry a prefix such as a
// kernel timestamp).
func ParseStatusLine(line string) (StatusLine, bool) {
	loc := StatusLineRE.FindStringSubmatchIndex(line)
	if loc == nil {
		return StatusLine{}, false
	}
	outcome := line[loc[2]:loc[3]]
	detail := strings.TrimPrefix(line[loc[1]:], ":")
	detail = strings.TrimSpace(detail)
	if outcome == OutcomeDone {
		detail = strings.TrimSuffix(strings.TrimPrefix(detail, "("), ")")
	}
	return StatusLine{Outcome: outcome, Detail: detail}, true
}

// EtcdLinePrefix starts the console line in which kiln-etcd-member reports, at every boot of
// an etcd member of several, that the member votes (or why it does not); a host that runs
// the cluster (kiln cluster up) waits for it on etcd nodes.
const EtcdLinePrefix = "kiln-init: etcd member "

// The etcd member's states a line reports.
const (
	EtcdVoting = "voting"
	EtcdFailed = "failed"
)

var etcdLineRE = regexp.MustCompile(regexp.QuoteMeta(EtcdLinePrefix) + `(\S+) (?:is a (voting) member|(failed): )(.*)$`)

// FormatEtcdVoting is the line of a member that votes, e.g. "kiln-init: etcd member b is a
// voting member after 41s (promoted from learner; etcd refused 3 times while it caught up)".
func FormatEtcdVoting(member string, after time.Duration, how string) string {
	return fmt.Sprintf("%s%s is a %s member after %s (%s)", EtcdLinePrefix, member, EtcdVoting, after, how)
}

// FormatEtcdFailed is the line of a member that kiln-etcd-member could not see voting;
// reason must be one line.
func FormatEtcdFailed(member, reason string) string {
	return EtcdLinePrefix + member + " " + EtcdFailed + ": " + reason
}

// EtcdLine is an etcd member line found on the console.
type EtcdLine struct {
	Member string
	// State is EtcdVoting or EtcdFailed.
	State string
	// Detail is the rest: how long it took and how, or the failure.
	Detail string
}

// ParseEtcdLine finds an etcd member line in a console line.
func ParseEtcdLine(line string) (EtcdLine, bool) {
	m := etcdLineRE.FindStringSubmatch(line)
	if m == nil {
		return EtcdLine{}, false
	}
	l := EtcdLine{Member: m[1], State: m[2] + m[3], Detail: strings.TrimSpace(m[4])}
	return l, true
}
