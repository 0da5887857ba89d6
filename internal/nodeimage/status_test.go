package nodeimage

import (
	"testing"
	"time"
)

// Every line first boot prints is recognised, with its outcome and detail, also behind a
// console prefix; other lines are not.
func TestParseStatusLine(t *testing.T) {
	finished := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tc := range []struct {
		line    string
		want    StatusLine
		matched bool
	}{
		{FormatOK("fw_cfg", 2, "tasks=3 applied=3 unchanged=0 failed=0", 35*time.Millisecond),
			StatusLine{OutcomeOK, "source=fw_cfg files=2 tasks=3 applied=3 unchanged=0 failed=0 duration=35ms"}, true},
		{"[   12.5] " + FormatFailed("task etcd: no volume"), StatusLine{OutcomeFailed, "task etcd: no volume"}, true},
		{FormatDone(finished), StatusLine{OutcomeDone, "2026-01-02T03:04:05Z"}, true},
		{"kiln-init: firstboot ok source=fw_cfg files=1", StatusLine{OutcomeOK, "source=fw_cfg files=1"}, true},
		{"kiln-init: stage 1", StatusLine{}, false},
		{"kiln-init: firstboot starting", StatusLine{}, false},
	} {
		got, ok := ParseStatusLine(tc.line)
		if ok != tc.matched || got != tc.want {
			t.Errorf("ParseStatusLine(%q) = %+v, %v; want %+v, %v", tc.line, got, ok, tc.want, tc.matched)
		}
		if StatusLineRE.MatchString(tc.line) != tc.matched {
			t.Errorf("StatusLineRE on %q: want match %v", tc.line, tc.matched)
		}
	}
}

// The exact text of the lines is what existing consoles and scripts match.
func TestFormat(t *testing.T) {
	for _, tc := range []struct{ got, want string }{
		{FormatOK("fw_cfg", 2, "tasks=0 applied=0 unchanged=0 failed=0", 35*time.Millisecond),
			"kiln-init: firstboot ok source=fw_cfg files=2 tasks=0 applied=0 unchanged=0 failed=0 duration=35ms"},
		{FormatFailed("boom"), "kiln-init: firstboot failed: boom"},
		{FormatDone(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)), "kiln-init: firstboot done already (2026-01-02T03:04:05Z)"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
}

// The etcd member's lines are recognised, behind a console prefix too; their text is what
// kiln cluster up waits for.
func TestEtcdLine(t *testing.T) {
	voting := FormatEtcdVoting("b", 41*time.Second, "promoted from learner")
	if want := "kiln-init: etcd member b is a voting member after 41s (promoted from learner)"; voting != want {
		t.Errorf("FormatEtcdVoting = %q, want %q", voting, want)
	}
	for _, tc := range []struct {
		line string
		want EtcdLine
		ok   bool
	}{
		{"[  80.1] " + voting, EtcdLine{"b", EtcdVoting, "after 41s (promoted from learner)"}, true},
		{FormatEtcdFailed("a", "context deadline exceeded"), EtcdLine{"a", EtcdFailed, "context deadline exceeded"}, true},
		{"kiln-init: etcd member: /etc/kiln/node.yaml runs no etcd member of several; nothing to do", EtcdLine{}, false},
		{"kiln-init: firstboot ok", EtcdLine{}, false},
	} {
		got, ok := ParseEtcdLine(tc.line)
		if ok != tc.ok || got != tc.want {
			t.Errorf("ParseEtcdLine(%q) = %+v, %v; want %+v, %v", tc.line, got, ok, tc.want, tc.ok)
		}
	}
}
