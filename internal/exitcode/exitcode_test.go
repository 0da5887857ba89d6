package exitcode

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
)

// Of reads the mark wherever it sits in the chain; a usage mark wins over a timeout.
func TestOf(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want int
	}{
		{"nil", nil, 0},
		{"plain", errors.New("task files failed"), Failure},
		{"canceled", context.Canceled, Failure},
		{"usage", Usage(errors.New("unknown flag")), BadUsage},
		{"usagef", Usagef("-o: unknown output format %q", "yaml"), BadUsage},
		{"wrapped usage", fmt.Errorf("status: %w", Usagef("-o: unknown output format")), BadUsage},
		{"timeout", Timeout(errors.New("no console line matched")), TimedOut},
		{"wrapped timeout", fmt.Errorf("run: %w", Timeout(errors.New("no line"))), TimedOut},
		{"deadline", context.DeadlineExceeded, TimedOut},
		{"wrapped deadline", fmt.Errorf("first boot: %w", context.DeadlineExceeded), TimedOut},
		{"usage over timeout", Usage(Timeout(errors.New("both"))), BadUsage},
		{"timeout over usage", Timeout(Usage(errors.New("both"))), BadUsage},
		{"usage over deadline", Usage(context.DeadlineExceeded), BadUsage},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Of(tc.err); got != tc.want {
				t.Errorf("Of(%v) = %d, want %d", tc.err, got, tc.want)
			}
		})
	}
}

// A mark changes neither the message nor what the error wraps, and nil stays nil.
func TestMarks(t *testing.T) {
	base := fmt.Errorf("wait: %w", context.Canceled)
	for _, tc := range []struct {
		name string
		mark func(error) error
	}{
		{"usage", Usage},
		{"timeout", Timeout},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.mark(nil); err != nil {
				t.Errorf("mark(nil) = %v, want nil", err)
			}
			err := tc.mark(base)
			if err.Error() != base.Error() || !errors.Is(err, context.Canceled) {
				t.Errorf("mark(%v) = %v, no longer the same error", base, err)
			}
		})
	}
	if got := Usagef("--until: %w", base).Error(); got != "--until: wait: context canceled" {
		t.Errorf("Usagef: %q", got)
	}
}

// Help lists every code.
func TestHelp(t *testing.T) {
	for _, want := range []string{"Exit codes:\n", "\n  0  success\n", "\n  1  failure", "\n  2  usage error",
		"\n  3  timeout"} {
		if !strings.Contains(Help, want) {
			t.Errorf("Help lacks %q:\n%s", want, Help)
		}
	}
}
