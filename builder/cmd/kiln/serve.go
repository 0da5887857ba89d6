package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/spf13/cobra"

	"github.com/kilnproject/kiln/builder/netboot"
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
  GET /images/NAME                      pxe files and install images (Range, ETag)
  GET /healthz

Before it listens, serve hashes every file a machine can be handed and compares it with the
sha256 the bake recorded, and renders and checks every machine's config: a missing or changed
file, a bad machines.yaml or a bad config stops it with the file (and line) at fault.
URLs in scripts are built from each request's Host, or from --advertise-url (an https URL of a
proxy in front of serve, for TLS). --tftp also serves --tftp-dir read-only over TFTP, for
firmware that chainloads iPXE (ipxe.efi, undionly.kpxe from Debian's ipxe package).

Nothing here is authenticated: anyone on the network can fetch every config and image. Put
no secrets in configs served this way, or keep the network to the machines it boots.
SIGINT or SIGTERM stops accepting, lets transfers in flight finish for --drain-timeout and
exits 0.`

const serveExample = `  # live workers and installed control planes from the bake's outputs in out/
  kiln serve out --listen :8080
  kiln serve out --config rack1.yaml --advertise-url http://10.0.0.2:8080

  # machines whose firmware speaks only PXE/TFTP: chainload iPXE first
  kiln serve out --tftp :69 --tftp-dir /usr/lib/ipxe

  # QEMU user networking reaches the host's 127.0.0.1:8080 as 10.0.2.2:8080
  kiln serve out --listen 127.0.0.1:8080 --advertise-url http://10.0.2.2:8080`

// serveOptions are kiln serve's flags.
type serveOptions struct {
	listen, advertise, config string
	tftpAddr, tftpDir         string
	drain                     time.Duration
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
	return cmd
}

func (o *serveOptions) run(ctx context.Context, dir string, log *slog.Logger) error {
	if (o.tftpAddr == "") != (o.tftpDir == "") {
		return exitcode.Usagef("--tftp and --tftp-dir go together")
	}
	if _, err := netboot.CheckAdvertiseURL(o.advertise); err != nil {
		return exitcode.Usage(err)
	}
	srv, err := netboot.Load(netboot.Options{Dir: dir, Machines: o.config, AdvertiseURL: o.advertise, Log: log})
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
	t, err := netboot.NewTFTP(o.tftpDir, log)
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
