package exitcode

import (
	"context"
	"fmt"
	"io"

	"github.com/spf13/cobra"
)

// Run executes root with args (see Execute) and returns the process's exit code. An error is
// printed to stderr after the program's name, and a usage error is followed by where to read
// the usage: the help of the command cobra chose, or of root.
func Run(ctx context.Context, root *cobra.Command, args []string, stderr io.Writer) int {
	cmd, err := Execute(ctx, root, args)
	code := Of(err)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", root.Name(), err)
	}
	if code == BadUsage {
		if cmd == nil {
			cmd = root
		}
		fmt.Fprintf(stderr, "Run '%s --help' for usage.\n", cmd.CommandPath())
	}
	return code
}

// Execute runs root with args and returns the command cobra chose and its error. Errors of the
// command line that cobra finds itself carry a Usage mark: flag errors (through root's
// FlagErrorFunc, which keeps any function already set), and an unknown command, arguments
// rejected by the command's Args, missing required flags and violated flag groups (by checking
// the command line again when the command failed).
func Execute(ctx context.Context, root *cobra.Command, args []string) (*cobra.Command, error) {
	flagErr := root.FlagErrorFunc()
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error { return Usage(flagErr(c, err)) })
	if args == nil {
		args = []string{} // nil would make cobra read os.Args
	}
	root.SetArgs(args)
	cmd, err := root.ExecuteContextC(ctx)
	if err != nil && Of(err) != BadUsage && commandLineWrong(root, cmd, args) {
		err = Usage(err)
	}
	return cmd, err
}

// commandLineWrong reports whether cobra rejects args for root: it finds no command for them,
// or cmd, the command it chose, rejects its arguments, lacks a required flag or has flags
// that break one of its flag groups.
func commandLineWrong(root, cmd *cobra.Command, args []string) bool {
	_, rest, err := root.Find(args)
	if err != nil {
		return true
	}
	if cmd == nil {
		return false
	}
	cmdArgs := cmd.Flags().Args()
	if cmd.DisableFlagParsing {
		cmdArgs = rest
	}
	return cmd.ValidateArgs(cmdArgs) != nil || cmd.ValidateRequiredFlags() != nil || cmd.ValidateFlagGroups() != nil
}
