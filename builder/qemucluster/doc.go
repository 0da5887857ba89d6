// Package qemucluster runs a whole kiln cluster as QEMU VMs on one host, the way kind or
// `talosctl cluster create` do for theirs: `kiln cluster up|status|stop|start|replace|down`.
// It bakes nothing; it takes the baked <image>-control-plane and <image>-worker disks.
//
// # State directory
//
// One directory per cluster (default $XDG_STATE_HOME/kiln/clusters/<name>, else
// ~/.local/state/kiln/clusters/<name>), 0700:
//
//	cluster.json                 the plan: nodes, addresses, MACs, sizes, API ports (State)
//	admin.conf                   kubeconfig, server https://127.0.0.1:<api port>, tls-server-name kubernetes
//	init/                        `kiln cluster init`'s output (CAs, per-node Ignition configs)
//	nodes/<node>/config.ign      the node's Ignition config + its address and the cluster's names
//	nodes/<node>/disk.qcow2      copy-on-write overlay on the baked image
//	nodes/<node>/etcd.qcow2      a control plane's etcd disk (serial etcd-main), sparse
//	nodes/<node>/console.log     serial console, appended across boots
//	nodes/<node>/qemu.log        QEMU's own messages
//	nodes/<node>/qemu.pid        pid of the running QEMU (absent when stopped)
//	nodes/<node>/OVMF_VARS.fd    the node's UEFI variable store
//
// # Network and names
//
// Every node has a NIC on a private link (QEMU socket networking over a loopback multicast
// group, as `kiln run --link`: no root, no bridge) with a fixed address, 192.168.100.1<i>
// for control plane i and 192.168.100.<100+i> for worker i, and an offline user-mode NIC
// that carries only the host's forwarded API ports. The guests have no DNS server: every
// node's config seeds /etc/hosts with every name of the cluster (each node's name, each
// etcd-<member>.internal.<cluster>.<zone> and one api.internal.<cluster>.<zone> line per
// control plane), because the addresses are fixed before the first boot and a BIND
// reachable from the guests would need the host's port 53.
package qemucluster
