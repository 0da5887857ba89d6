package qemutests

import (
	"context"
	"errors"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// fixedConsole is a console that printed lines and nothing more: WaitFor returns the first
// matching line or waits for ctx, as a hung guest's console does.
type fixedConsole []string

func (c fixedConsole) WaitFor(ctx context.Context, re *regexp.Regexp) (string, error) {
	for _, l := range c {
		if re.MatchString(l) {
			return l, nil
		}
	}
	<-ctx.Done()
	return "", ctx.Err()
}

// Real first lines of the reports of Debian's 6.1 kernel.
var stallLines = []string{
	"[  442.81] rcu: INFO: rcu_preempt detected stalls on CPUs/tasks:",
	"[  442.81] rcu: INFO: rcu_preempt self-detected stall on CPU",
	"[  442.81] rcu: rcu_preempt kthread starved for 21001 jiffies! g3613 f0x0 RCU_GP_WAIT_FQS(5) ->state=0x402 ->cpu=1",
	"[  58.769175] watchdog: BUG: soft lockup - CPU#0 stuck for 46s! [(udev-worker):120]",
}

func TestGuestStallMatches(t *testing.T) {
	for _, l := range stallLines {
		if !guestStall.MatchString(l) {
			t.Errorf("guestStall does not match %q", l)
		}
	}
	for _, l := range []string{
		"[    0.000000] rcu: Preemptible hierarchical RCU implementation.",
		"[    0.395704] rcu: 	Max phase no-delay instances is 1000.",
		"kiln-init: firstboot ok source=fw_cfg files=5",
	} {
		if guestStall.MatchString(l) {
			t.Errorf("guestStall matches the ordinary line %q", l)
		}
	}
}

func TestWaitUnstalled(t *testing.T) {
	want := regexp.MustCompile(`firstboot ok|firstboot failed`)
	const grace = 50 * time.Millisecond
	tests := []struct {
		name     string
		console  fixedConsole
		wantLine string // "" when the wait must fail
		stalled  bool   // the failure must name the stall
		logged   bool
	}{
		{"no stall", fixedConsole{"boot", "firstboot ok"}, "firstboot ok", false, false},
		{"line before a stall", fixedConsole{"firstboot ok", stallLines[0]}, "firstboot ok", false, false},
		{"recovers after a stall", fixedConsole{"boot", stallLines[2], "more", "firstboot ok"}, "firstboot ok", false, true},
		{"hangs after a stall", fixedConsole{"boot", stallLines[0], "  stack"}, "", true, true},
		{"silent without a stall", fixedConsole{"boot"}, "", false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			logged := false
			start := time.Now()
			line, err := waitUnstalled(ctx, tt.console, want, grace, func(string, ...any) { logged = true })
			if tt.wantLine != "" {
				if err != nil || line != tt.wantLine {
					t.Fatalf("waitUnstalled = %q, %v; want %q", line, err, tt.wantLine)
				}
			} else {
				if err == nil {
					t.Fatalf("waitUnstalled = %q, nil; want an error", line)
				}
				if got := strings.Contains(err.Error(), "stalled"); got != tt.stalled {
					t.Errorf("error %q names a stall: %v, want %v", err, got, tt.stalled)
				}
				// A hung guest ends the wait after the grace, not at the boot's timeout.
				if tt.stalled && (!errors.Is(err, context.DeadlineExceeded) || time.Since(start) > time.Second) {
					t.Errorf("the wait after a stall took %s (%v); want about %s", time.Since(start), err, grace)
				}
			}
			if logged != tt.logged {
				t.Errorf("logged %v, want %v", logged, tt.logged)
			}
		})
	}
}

func TestStallReport(t *testing.T) {
	lines := []string{"a", "b", stallLines[0], "  stack 1", "  stack 2", stallLines[0], "again"}
	got := stallReport(lines)
	if !strings.HasPrefix(got, "first stall report of the guest kernel:\n"+stallLines[0]+"\n  stack 1\n") || !strings.HasSuffix(got, "again\n") {
		t.Errorf("stallReport = %q", got)
	}
	if got := stallReport([]string{"a", "b"}); got != "" {
		t.Errorf("stallReport without a stall = %q, want empty", got)
	}
}

// silentMachine is a machine whose console is silent from a given time on (after each power
// cycle, from cycleQuiet on), counting power cycles and stops.
type silentMachine struct {
	mu         sync.Mutex
	start      time.Time
	quietFrom  time.Duration // console lines until then; silence after
	cycleQuiet time.Duration // after a power cycle: lines until then (0: talks for good)
	cycles     int
	stops      int
	cycleErr   error
}

func (s *silentMachine) Quiet() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.quietFrom == 0 {
		return 0
	}
	return max(0, time.Since(s.start)-s.quietFrom)
}

func (s *silentMachine) PowerCycle() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cycleErr != nil {
		return s.cycleErr
	}
	s.cycles++
	s.start, s.quietFrom = time.Now(), s.cycleQuiet
	return nil
}

func (s *silentMachine) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stops++
}

func TestWatchFrozen(t *testing.T) {
	const after = 60 * time.Millisecond
	for _, tc := range []struct {
		name          string
		m             *silentMachine
		cycles, stops int
		says          string
	}{
		{"talks", &silentMachine{}, 0, 0, ""},
		{"freezes once", &silentMachine{quietFrom: time.Millisecond}, 1, 0, "power-cycled once after"},
		{"freezes twice", &silentMachine{quietFrom: time.Millisecond, cycleQuiet: time.Millisecond}, 1, 1, "silent for"},
		{"cannot cycle", &silentMachine{quietFrom: time.Millisecond, cycleErr: errors.New("power cycle: the machine runs on a snapshot")}, 0, 0, "snapshot"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.m.start = time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), 10*after)
			defer cancel()
			did := watchFrozen(ctx, tc.m, after, t.Logf)
			<-ctx.Done()
			time.Sleep(after / 5)
			tc.m.mu.Lock()
			defer tc.m.mu.Unlock()
			if tc.m.cycles != tc.cycles || tc.m.stops != tc.stops {
				t.Errorf("%d power cycles, %d stops; want %d, %d", tc.m.cycles, tc.m.stops, tc.cycles, tc.stops)
			}
			if got := did(); tc.says == "" && got != "" || !strings.Contains(got, tc.says) {
				t.Errorf("says %q, want %q in it", got, tc.says)
			}
		})
	}
}
