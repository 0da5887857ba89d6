package main

import (
	"context"
	"crypto"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/kilnproject/kiln/builder/netboot"
	"github.com/kilnproject/kiln/builder/provenance"
	"github.com/kilnproject/kiln/internal/exitcode"
)

const serveLong = `Serve answers machines booting from the network (iPXE over HTTP) with the pxe outputs baked
into DIR and the machines declared in machines.yaml (DIR/machines.yaml unless --config says
otherwise):

  GET /boot.ipxe                        a script that chains to the next line with the MAC of
                                        the machine's first NIC, its SMBIOS UUID and DHCP hostname
  GET /boot.ipxe?mac=…&uuid=…&hostname=…  that machine's script: live (kiln.live.rootfs_url) or
                                        install (kiln.install.*), with kiln.config.url; an
                                        unknown machine gets a 404 and the log names its MAC
  GET /config/ID                        the machine's Ignition config, rendered per machine
  GET /images/NAME                      pxe files, install images (Range, ETag) and each
                                        image's <image>-<role>.json (kiln-init update --from)
  GET /healthz

Before it listens, serve hashes every file a machine can be handed and compares it with the
sha256 the bake recorded, and renders and checks every machine's config: a missing or changed
file, a bad machines.yaml or a bad config stops it with the file (and line) at fault.
With --key PUB (or $KILN_VERIFY_KEY), every image served must also carry a signed provenance
(<image>-<role>.intoto.jsonl, from kiln bake --sign-key) that verifies with PUB and names its
metadata with that file's sha256, so every file served from the metadata is the one signed;
an image that does not verify, or an install image the bake did not record (a compressed raw
with only a .sha256 beside it), stops serve naming it.
URLs in scripts are built from each request's Host, or from --advertise-url (an https URL of a
proxy in front of serve, for TLS). --tftp also serves --tftp-dir read-only over TFTP, for
firmware that chainloads iPXE (ipxe.efi, undionly.kpxe from Debian's ipxe package).

Nothing here is authenticated: anyone on the network can fetch every script, config and
image. So before it listens serve scans every config it would hand out with the bake's
secret scanner (the files and units it writes) and refuses to start when one holds a private
key or a token (kiln cluster init's control-plane configs carry the CA keys, its workers' the
bootstrap token), naming the config file, the machines it would go to and what it holds.
--allow-secrets serves them anyway, with one warning per config file at startup: only on a
boot network that reaches nothing but the machines it boots. To keep a machine's keys off the
network, give its group no config and the machine no hostname or etcdMember (either makes a
served config with kiln.config.url=), name install.dev (dev: auto cannot tell the etcd disk
without the config), and hand the machine its config on a CIDATA volume (user-data, e.g. USB
or virtual media): a metal node's first boot reads it when its kernel command line has no
kiln.config.url=.

Limits: a response must move at least 256 KiB every --stall-timeout or its connection is
cut (a slow download that keeps moving is not: there is no bound on a whole transfer);
at most --max-conns HTTP connections are open at once (more wait in the kernel's accept
queue) and as many TFTP transfers run at once (more are answered with a TFTP error);
a Range header may ask for at most 16 ranges (more are answered 416, not served whole); a
request with a body is answered 400; a client has 10 s to send a request's header and a
kept-alive connection is closed after 30 s without one. Only regular files are served: a
FIFO, device or directory in DIR or --tftp-dir is refused without being opened, and a file
that changed since startup (another inode, size, mtime or ctime) is answered 503.
SIGINT or SIGTERM stops accepting, lets transfers in flight finish for --drain-timeout and
exits 0.`

const serveExample = `  # live workers and installed control planes from the bake's outputs in out/
  kiln serve out --listen :8080
  kiln serve out --config rack1.yaml --advertise-url http://10.0.0.2:8080

  # machines whose firmware speaks only PXE/TFTP: chainload iPXE first
  kiln serve out --tftp :69 --tftp-dir /usr/lib/ipxe

  # QEMU user networking reaches the host's 127.0.0.1:8080 as 10.0.2.2:8080
  kiln serve out --listen 127.0.0.1:8080 --advertise-url http://10.0.2.2:8080

  # kiln cluster init's configs (CA keys, bootstrap token), on a boot VLAN of these machines only
  kiln serve out --config cluster.yaml --allow-secrets

  # only images signed with the release key (kiln bake --sign-key)
  kiln serve out --key release.pub

  # a rack of 2000 machines booting at once over a slow uplink
  kiln serve out --max-conns 4096 --stall-timeout 5m`

// serveOptions are kiln serve's flags.
type serveOptions struct {
	listen, advertise, config string
	tftpAddr, tftpDir         string
	drain, stall              time.Duration
	maxConns                  int
	allowSecrets              bool
	key                       string
}

func newServeCmd() *cobra.Command {
	var o serveOptions
	cmd := &cobra.Command{
		Use:     "serve DIR",
		Short:   "Serve pxe outputs, iPXE scripts and node configs to machines booting from the network",
		Long:    serveLong,
		Example: serveExample,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return o.run(cmd.Context(), args[0], slog.Default())
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.listen, "listen", ":8080", "HTTP address to listen on")
	f.StringVar(&o.advertise, "advertise-url", "", "base URL in scripts and kernel parameters (default: from each request's Host)")
	f.StringVar(&o.config, "config", "", "machines file (default DIR/machines.yaml)")
	f.StringVar(&o.tftpAddr, "tftp", "", "also serve --tftp-dir read-only over TFTP on this UDP address, e.g. :69")
	f.StringVar(&o.tftpDir, "tftp-dir", "", "directory served over TFTP (with --tftp)")
	f.DurationVar(&o.drain, "drain-timeout", 30*time.Second, "on SIGINT/SIGTERM, how long transfers in flight may finish")
	f.DurationVar(&o.stall, "stall-timeout", netboot.DefaultStallTimeout, "cut a response whose client takes less than 256 KiB in this long")
	f.IntVar(&o.maxConns, "max-conns", netboot.DefaultMaxConns, "HTTP connections open at once (more wait to be accepted), and TFTP transfers (more are refused)")
	f.StringVar(&o.key, "key", "", "PEM public key (ed25519 or ECDSA P-256): serve only images whose signed provenance verifies with it (default: $KILN_VERIFY_KEY)")
	f.BoolVar(&o.allowSecrets, "allow-secrets", false, "serve configs holding private keys or tokens, with a warning (refused by default: anyone on the network can fetch them)")
	return cmd
}

func (o *serveOptions) run(ctx context.Context, dir string, log *slog.Logger) error {
	if (o.tftpAddr == "") != (o.tftpDir == "") {
		return exitcode.Usagef("--tftp and --tftp-dir go together")
	}
	if _, err := netboot.CheckAdvertiseURL(o.advertise); err != nil {
		return exitcode.Usage(err)
	}
	if o.stall <= 0 {
		return exitcode.Usagef("--stall-timeout %s: must be positive", o.stall)
	}
	if o.maxConns < 1 {
		return exitcode.Usagef("--max-conns %d: must be at least 1", o.maxConns)
	}
	keyPath := o.key
	if keyPath == "" {
		keyPath = os.Getenv("KILN_VERIFY_KEY")
	}
	var key crypto.PublicKey
	if keyPath != "" {
		var err error
		if key, err = provenance.LoadPublicKey(keyPath); err != nil {
			return exitcode.Usagef("--key: %v", err)
		}
	}
	srv, err := netboot.Load(netboot.Options{Dir: dir, Machines: o.config, AdvertiseURL: o.advertise,
		AllowSecrets: o.allowSecrets, StallTimeout: o.stall, MaxConns: o.maxConns, VerifyKey: key, Log: log})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return fmt.Errorf("--listen: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 2)
	running := 1
	if o.tftpAddr != "" {
		if err := o.startTFTP(ctx, log, errc); err != nil {
			ln.Close()
			return err
		}
		running++
	}
	log.Info("serving", "http", ln.Addr().String(), "dir", dir)
	go func() { errc <- srv.Serve(ctx, ln, o.drain) }()
	var errs []error
	for range running {
		if err := <-errc; err != nil {
			errs = append(errs, err)
			cancel() // one server failing stops the other
		}
	}
	return errors.Join(errs...)
}

func (o *serveOptions) startTFTP(ctx context.Context, log *slog.Logger, errc chan<- error) error {
	t, err := netboot.NewTFTP(o.tftpDir, o.maxConns, log)
	if err != nil {
		return err
	}
	network := "udp"
	if host, _, err := net.SplitHostPort(o.tftpAddr); err == nil && host == "" {
		network = "udp4" // PXE firmware speaks IPv4; a wildcard address listens on IPv4's
	}
	conn, err := net.ListenPacket(network, o.tftpAddr)
	if err != nil {
		return fmt.Errorf("--tftp: %w", err)
	}
	log.Info("serving", "tftp", conn.LocalAddr().String(), "dir", o.tftpDir)
	go func() { errc <- t.Serve(ctx, conn) }()
	return nil
}
