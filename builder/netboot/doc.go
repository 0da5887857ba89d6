// Package netboot serves baked pxe outputs to machines booting from the network: `kiln
// serve`'s HTTP server (iPXE scripts, node configs, kernels, initramfs, root images and raw
// images) and its optional read-only TFTP server.
//
// # machines.yaml
//
// The machines a server answers are declared in groups (see Machines and docs/netboot.md,
// "Serving them: kiln serve"). A group names a baked image and role (<image>-<role>, whose
// pxe directory and metadata are in the served directory), a mode (live or install), a node
// config (Ignition JSON or Butane YAML) and the machines it holds: a group-wide selector and
// per-machine entries with their own selector and values (hostname, etcd member, kernel
// arguments). A selector matches a machine's MAC address, SMBIOS UUID or DHCP hostname as
// iPXE reports them; a MAC or UUID belongs to one entry only.
//
// # What is checked at startup
//
// Everything a machine can be handed is known before the server listens: every file it
// serves is hashed once and compared with the sha256 the bake recorded (a missing file or a
// mismatch refuses the start, naming the file), every machine's config is rendered and
// checked with the node's own parser (initd/config), and the sha256 doubles as the file's
// strong ETag. Requests can reach nothing else: URL paths are looked up in that table, never
// joined to a directory. Only regular files are read, each opened non-blocking after a stat
// and checked again once open, so a FIFO cannot hold the server; a file whose inode, size,
// mtime or ctime changed since it was hashed is answered 503, not served under its ETag.
//
// # Secrets
//
// Nothing a server hands out is authenticated, so every group's config is scanned with the
// bake's secret scanner (bake.ScanSecrets) over the files and units it writes, once per
// config file. Load refuses a config holding a private key or a token, naming the file, the
// machines it would go to and what it holds, unless Options.AllowSecrets, which logs one
// warning per config file instead.
//
// # Limits
//
// A response must take 256 KiB per StallTimeout: its write deadline moves ahead before each
// 256 KiB, so a stalled client is cut and a slow one that keeps moving is not. Serve holds at
// most MaxConns connections, bounds the wait for a request's header and a kept-alive
// connection's idleness, refuses a request with a body (400) and a Range header of more than
// 16 ranges (416). The TFTP server runs at most as many transfers as it is given and refuses
// more at once.
//
// # Per-machine configs
//
// A machine's config is its group's config with the machine's values written into it, as a
// later config's file entry wins in Ignition's merge: hostname and etcd member go into the
// /etc/kiln/node.yaml the group's config carries (its other fields kept), or, for a
// hostname when the config carries no node.yaml, as /etc/hostname — the two places first
// boot takes a hostname from. An etcd member needs a node.yaml with etcd.members.
package netboot
