package main

import (
	"errors"

	"github.com/spf13/cobra"
)

// Exit codes of kiln; kiln-init uses the same.
const (
	// exitFailure is any error, a failed first boot included.
	exitFailure = 1
	// exitUsage is a wrong command line: an unknown command or flag, a wrong number of
	// arguments, a missing required flag or a malformed flag value.
	exitUsage = 2
	// exitTimeout is `kiln run` giving up on the first-boot status line (or the --until
	// pattern) when --timeout has passed.
	exitTimeout = 3
)

// exitHelp documents the exit codes in kiln's help.
const exitHelp = `Exit status:
  0  success
  1  an error, a failed first boot (kiln run --until-firstboot) included
  2  a wrong command line: unknown command or flag, wrong number of arguments, missing or
     malformed flag value
  3  kiln run: --timeout passed before the first-boot status line (--until-firstboot) or
     the --until pattern appeared`

// codeError is an error that ends kiln with a given exit code.
type codeError struct {
	code int
	err  error
}

func (e *codeError) Error() string { return e.err.Error() }
func (e *codeError) Unwrap() error { return e.err }

// usageError marks err as a mistake on the command line.
func usageError(err error) error { return &codeError{code: exitUsage, err: err} }

// timeoutError marks err as a timeout waiting for the console.
func timeoutError(err error) error { return &codeError{code: exitTimeout, err: err} }

// exitCode is the exit code for err, the outcome of running root with args; cmd is the
// command cobra chose. Errors cobra finds in the command line itself (an unknown command, the
// arguments, required flags) are recognised by checking the command line again.
func exitCode(root, cmd *cobra.Command, args []string, err error) int {
	var ce *codeError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ce):
		return ce.code
	case usageMistake(root, cmd, args):
		return exitUsage
	}
	return exitFailure
}

// usageMistake reports whether the command line args is wrong for root: cobra finds no command
// for it, or cmd (already parsed) rejects its arguments or lacks a required flag.
func usageMistake(root, cmd *cobra.Command, args []string) bool {
	if _, _, err := root.Find(args); err != nil {
		return true
	}
	if cmd == nil {
		return false
	}
	return cmd.ValidateArgs(cmd.Flags().Args()) != nil || cmd.ValidateRequiredFlags() != nil || cmd.ValidateFlagGroups() != nil
}

// showHelp is the action of a command that only groups others: it prints the help, and an
// unknown subcommand fails its cobra.NoArgs as a usage error.
func showHelp(cmd *cobra.Command, _ []string) error { return cmd.Help() }
