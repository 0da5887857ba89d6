// Package exitcode holds the exit codes both kiln programs use and how an error carries one:
// Usage and Timeout mark an error, Of reads the code back, and Execute runs a cobra command
// tree so that cobra's own command-line errors count as usage errors.
package exitcode

import (
	"context"
	"errors"
	"fmt"
)

// The exit codes of kiln and kiln-init. Success is 0.
const (
	// Failure is any error, a failed first boot included.
	Failure = 1
	// BadUsage is a wrong command line: an unknown command or flag, a wrong number of
	// arguments, a missing required flag or a malformed flag value.
	BadUsage = 2
	// TimedOut is a wait that ran out of time.
	TimedOut = 3
)

// usageError marks a mistake on the command line.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// timeoutError marks a wait that ran out of time.
type timeoutError struct{ err error }

func (e timeoutError) Error() string { return e.err.Error() }
func (e timeoutError) Unwrap() error { return e.err }

// Usage marks err as a mistake on the command line (exit code BadUsage); nil stays nil.
func Usage(err error) error {
	if err == nil {
		return nil
	}
	return usageError{err}
}

// Usagef is Usage(fmt.Errorf(format, a...)).
func Usagef(format string, a ...any) error { return usageError{fmt.Errorf(format, a...)} }

// Timeout marks err as a wait that ran out of time (exit code TimedOut); nil stays nil.
func Timeout(err error) error {
	if err == nil {
		return nil
	}
	return timeoutError{err}
}

// Of is the exit code for err: 0 for nil, BadUsage if err carries a Usage mark, TimedOut if it
// carries a Timeout mark or is context.DeadlineExceeded, and Failure otherwise.
func Of(err error) int {
	var u usageError
	var t timeoutError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &u):
		return BadUsage
	case errors.As(err, &t), errors.Is(err, context.DeadlineExceeded):
		return TimedOut
	}
	return Failure
}

// Help is the exit-code block of a program's help. A program may go on with what times out
// in it: ": ..." on the same line, further lines indented by five spaces.
const Help = `Exit codes:
  0  success
  1  failure: any error, a failed first boot included
  2  usage error: an unknown command or flag, a wrong number of arguments, a missing or
     malformed flag value
  3  timeout: a wait ran out`
