package preflight

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
)

const mainUsage = `usage: kiln-init preflight --role control-plane|worker|etcd [-o table|json] [flags]

Checks that this machine can become a node of the role and prints one line per check.
Exits non-zero when an error-level check fails.

`

// Main is `kiln-init preflight`: it parses args (without the sub-command name), runs the
// checks for --role and prints the report on stdout. It returns Report.Err, so the
// caller exits non-zero when an error-level check failed, or a usage error.
func Main(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("kiln-init preflight", flag.ContinueOnError)
	fs.SetOutput(stdout)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), mainUsage)
		fs.PrintDefaults()
	}
	role := fs.String("role", "", "the node's role: control-plane, worker or etcd (required)")
	var format string
	fs.StringVar(&format, "o", "table", "output format: table or json")
	fs.StringVar(&format, "output", "table", "same as -o")
	var o Options
	fs.StringVar(&o.Root, "root", "/", "the node's root directory")
	fs.StringVar(&o.CRISocket, "cri-socket", "/run/containerd/containerd.sock", "the container runtime's socket")
	skip := fs.String("skip", "", "comma-separated checks not to run")
	ignore := fs.String("ignore", "", `comma-separated checks whose failure is only reported ("all" for every check)`)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return fmt.Errorf("preflight: %w", err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("preflight: unexpected argument %q", fs.Arg(0))
	}
	if *role == "" {
		return errors.New("preflight: --role is required (control-plane, worker or etcd)")
	}
	r, err := ParseRole(*role)
	if err != nil {
		return fmt.Errorf("preflight: --role: %w", err)
	}
	if format != "table" && format != "json" {
		return fmt.Errorf("preflight: -o: unknown output format %q (want table or json)", format)
	}
	o.Skip, o.Ignore = splitList(*skip), splitList(*ignore)
	rep, err := Run(ctx, r, o)
	if err != nil {
		return err
	}
	if err := rep.Print(stdout, format); err != nil {
		return fmt.Errorf("preflight: print: %w", err)
	}
	return rep.Err()
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}
