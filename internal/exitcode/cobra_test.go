package exitcode

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// newTree is a small command tree: a group without an action and two commands that fail as
// their flags say.
func newTree() *cobra.Command {
	root := &cobra.Command{Use: "prog", SilenceUsage: true, SilenceErrors: true}
	group := &cobra.Command{Use: "group", Args: cobra.NoArgs, RunE: func(c *cobra.Command, _ []string) error { return c.Help() }}
	var fail string
	var count int
	var a, b bool
	do := &cobra.Command{
		Use:  "do NAME",
		Args: cobra.ExactArgs(1),
		RunE: func(*cobra.Command, []string) error {
			switch fail {
			case "plain":
				return errors.New("it broke")
			case "usage":
				return Usagef("--fail: bad")
			case "timeout":
				return Timeout(errors.New("gave up"))
			case "deadline":
				return context.DeadlineExceeded
			}
			return nil
		},
	}
	do.Flags().StringVar(&fail, "fail", "", "how to fail")
	do.Flags().IntVar(&count, "count", 0, "a number")
	do.Flags().BoolVar(&a, "a", false, "a")
	do.Flags().BoolVar(&b, "b", false, "b")
	do.MarkFlagsMutuallyExclusive("a", "b")
	need := &cobra.Command{Use: "need", Args: cobra.NoArgs, RunE: func(*cobra.Command, []string) error { return nil }}
	need.Flags().String("name", "", "required")
	_ = need.MarkFlagRequired("name")
	group.AddCommand(need)
	root.AddCommand(group, do)
	return root
}

// Cobra's own command-line errors exit BadUsage; the command's errors keep their own code.
func TestExecute(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want int
	}{
		{nil, 0},
		{[]string{"--help"}, 0},
		{[]string{"group"}, 0},
		{[]string{"do", "x"}, 0},
		{[]string{"group", "need", "--name", "n"}, 0},
		{[]string{"nosuch"}, BadUsage},
		{[]string{"group", "nosuch"}, BadUsage},
		{[]string{"--nosuch"}, BadUsage},
		{[]string{"do", "x", "--nosuch"}, BadUsage},
		{[]string{"do", "x", "--count", "lots"}, BadUsage},
		{[]string{"do"}, BadUsage},
		{[]string{"do", "x", "y"}, BadUsage},
		{[]string{"do", "x", "--a", "--b"}, BadUsage},
		{[]string{"group", "need"}, BadUsage},
		{[]string{"do", "x", "--fail", "usage"}, BadUsage},
		{[]string{"do", "x", "--fail", "plain"}, Failure},
		{[]string{"do", "x", "--fail", "timeout"}, TimedOut},
		{[]string{"do", "x", "--fail", "deadline"}, TimedOut},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			root := newTree()
			root.SetOut(&bytes.Buffer{})
			_, err := Execute(context.Background(), root, tc.args)
			if got := Of(err); got != tc.want {
				t.Errorf("exit %d (%v), want %d", got, err, tc.want)
			}
		})
	}
}

// Execute keeps a flag error function the program set and marks what it returns.
func TestExecuteKeepsFlagErrorFunc(t *testing.T) {
	root := newTree()
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return errors.New("custom: " + err.Error()) })
	cmd, err := Execute(context.Background(), root, []string{"do", "x", "--count", "lots"})
	if Of(err) != BadUsage || !strings.HasPrefix(err.Error(), "custom: ") {
		t.Errorf("err %v (exit %d), want the custom flag error as a usage error", err, Of(err))
	}
	if cmd == nil || cmd.Name() != "do" {
		t.Errorf("command %v, want do", cmd)
	}
}

// Run prints the error after the program's name and, for a usage error, the help to read: the
// chosen command's, or the program's when no command matched.
func TestRunPrints(t *testing.T) {
	tests := []struct {
		args []string
		code int
		want []string
	}{
		{[]string{"do", "x"}, 0, nil},
		{[]string{"do", "x", "--fail", "plain"}, Failure, []string{"prog: it broke\n"}},
		{[]string{"do", "x", "--count", "many"}, BadUsage, []string{"prog: invalid argument", "Run 'prog do --help' for usage.\n"}},
		{[]string{"nosuch"}, BadUsage, []string{"prog: unknown command", "Run 'prog --help' for usage.\n"}},
		{[]string{"do", "x", "--fail", "timeout"}, TimedOut, []string{"prog: gave up\n"}},
	}
	for _, tt := range tests {
		var stderr bytes.Buffer
		code := Run(context.Background(), newTree(), tt.args, &stderr)
		if code != tt.code {
			t.Errorf("%v: exit %d, want %d", tt.args, code, tt.code)
		}
		if tt.want == nil && stderr.Len() > 0 {
			t.Errorf("%v: printed %q on success", tt.args, stderr.String())
		}
		for _, w := range tt.want {
			if !strings.Contains(stderr.String(), w) {
				t.Errorf("%v: stderr %q lacks %q", tt.args, stderr.String(), w)
			}
		}
		if code != BadUsage && strings.Contains(stderr.String(), "for usage") {
			t.Errorf("%v: usage hint on a non-usage error: %q", tt.args, stderr.String())
		}
	}
}
