// Command kiln-init is the one binary kiln puts in every image: PID 1 of the initramfs (stage 1:
// mount the read-only root and the persistent /var and /etc, then switch_root to systemd) and the
// node agent run by systemd (`firstboot`, `status`, `dns`, `kube images|cni|bootstrap`).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/kilnproject/kiln/initd/dns"
	"github.com/kilnproject/kiln/initd/firstboot"
	"github.com/kilnproject/kiln/initd/kube"
	"github.com/kilnproject/kiln/initd/preflight"
	"github.com/kilnproject/kiln/initd/stage1"
)

// version is set at build time with -ldflags "-X main.version=…".
var version = "dev"

const usage = `kiln-init: the kiln node agent

As /init in the initramfs (PID 1) it runs stage 1 and hands over to systemd.
Otherwise:
  kiln-init firstboot [--force] [--ignore-preflight=a,b]
                                 apply the node config (run once by kiln-firstboot.service)
  kiln-init status [-o json]     show what first boot did, task by task, and the DNS state
  kiln-init dns                  publish this node's cluster names (kiln-dns.service, every boot)
  kiln-init kube images|cni|bootstrap
                                 the Kubernetes steps after first boot (kiln-images, kiln-cni and
                                 kiln-control-plane.service); see kiln-init kube help
  kiln-init preflight --role R [-o table|json]
                                 run kubeadm's preflight checks for role R and print them
  kiln-init version
`

func main() {
	if os.Getpid() == 1 {
		runStage1()
		return
	}
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	switch os.Args[1] {
	case "firstboot":
		err = runFirstboot(ctx, os.Args[2:])
	case "status":
		err = runStatus(os.Args[2:])
	case "dns":
		log := slog.New(slog.NewTextHandler(os.Stderr, nil))
		var st dns.State
		st, err = firstboot.RegisterDNS(ctx, "/", log)
		if err == nil && st.State != "" {
			fmt.Println("kiln-init: dns " + st.String())
		}
	case "preflight":
		err = preflight.Main(ctx, os.Args[2:], os.Stdout)
	case "kube":
		err = runKube(ctx, os.Args[2:])
	case "version", "--version":
		fmt.Println(version)
	case "help", "-h", "--help":
		fmt.Print(usage)
	default:
		fmt.Fprintf(os.Stderr, "kiln-init: unknown command %q\n\n%s", os.Args[1], usage)
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "kiln-init:", err)
		os.Exit(1)
	}
}

// runStage1 is PID 1. It must never return: a PID 1 that exits panics the kernel and hides why.
func runStage1() {
	console := openConsole()
	log := slog.New(slog.NewTextHandler(console, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		},
	})).With("prog", "kiln-init")
	err := stage1.Run(context.Background(), log)
	fmt.Fprintf(console, "kiln-init: stage 1 failed: %v\n", err)
	fmt.Fprintln(console, "kiln-init: cannot continue the boot; the machine waits here (power it off)")
	for {
		time.Sleep(time.Hour)
	}
}

func openConsole() io.Writer {
	// The kernel gives PID 1 /dev/console as stdin/out/err when the initramfs has the node.
	if f, err := os.OpenFile("/dev/console", os.O_WRONLY, 0); err == nil {
		return f
	}
	return os.Stderr
}

func runFirstboot(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("firstboot", flag.ContinueOnError)
	root := fs.String("root", "/", "root of the node's filesystem")
	force := fs.Bool("force", false, "run every task again even if first boot succeeded (changes nothing on a converged node)")
	ignore := fs.String("ignore-preflight", "", "comma-separated preflight checks whose failure does not stop the Kubernetes tasks")
	if err := fs.Parse(args); err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	var ignored []string
	if *ignore != "" {
		ignored = strings.Split(*ignore, ",")
	}
	st, err := firstboot.Run(ctx, firstboot.Options{
		Root:            *root,
		Force:           *force,
		PreflightIgnore: ignored,
		Log:             log,
		Version:         version,
	})
	if st != nil {
		// One line for the console (the unit sends stdout to journal+console).
		fmt.Println(st.Line())
	}
	if err != nil {
		return err
	}
	return nil
}

func runStatus(args []string) error {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	root := fs.String("root", "/", "root of the node's filesystem")
	out := fs.String("o", "table", "output format: table or json")
	if err := fs.Parse(args); err != nil {
		return err
	}
	st, err := firstboot.ReadStatus(*root)
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("no status at %s: first boot has not run", filepath.Join(*root, "var/lib/kiln/status.json"))
	}
	if err != nil {
		return err
	}
	if err := firstboot.PrintStatus(os.Stdout, st, *out); err != nil {
		return err
	}
	if d, err := (dns.StatusFile{Root: *root}).Read(); err == nil && *out != "json" {
		fmt.Printf("\nDNS  %s (%s, %d records, attempts %d)\n", d.String(), d.Provider, len(d.Records), d.Attempts)
	}
	// The Kubernetes stages after first boot (images, cni, control-plane).
	stages, err := kube.ReadStages(*root)
	if err != nil {
		return err
	}
	if len(stages) > 0 && *out != "json" {
		fmt.Println()
		return kube.PrintStages(os.Stdout, stages)
	}
	return nil
}
