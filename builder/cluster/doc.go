// Package cluster generates what a new cluster needs before its first node boots, like
// `kubeadm init` + `talosctl gen config`: the cluster's CAs and service-account key, an
// admin kubeconfig, a bootstrap token, and one Ignition config per node. `kiln cluster
// init` is its command line.
//
// # Nodes
//
// A cluster named N has control-plane nodes N-cp-1 … N-cp-<1|3> and workers N-worker-1 …
// N-worker-<W>. Control plane i is etcd member a, b or c (i = 1, 2, 3); its etcd peer name
// is etcd-<member>.internal.<N>.<zone>. The API endpoint defaults to
// api.internal.<N>.<zone>:6443.
//
// With EtcdNodes (--etcd-nodes 1|3|5), etcd runs on nodes of its own, N-etcd-1 … (members
// a, b, c, d, e), and the control planes run no member: their node.yaml says etcd.external
// and names the members, which their API servers reach by the same DNS names (kubeadm's
// external etcd topology).
//
// The first member is the seed: it starts a one-member cluster and the others join it one
// at a time as learners (initd/etcdmember), so the nodes may boot in any order.
//
// # Command line
//
//	kiln cluster init --name N --dns-zone Z -o DIR
//	    [--control-planes 1|3]          default 1
//	    [--workers W]                   default 1
//	    [--etcd-nodes 0|1|3|5]          default 0 (a member on each control plane)
//	    [--api-endpoint host:port]      default api.internal.N.Z:6443; node.yaml apiEndpoint, bootstrap-kubelet.conf server
//	    [--etcd-disk-serial S]          default etcd-main ("" keeps etcd on /var); node.yaml etcd.volume.serial of each member
//	    [--kubernetes-version V]        default v1.37.2
//	    [--pod-cidr C] [--service-cidr C]  defaults 10.244.0.0/16, 10.96.0.0/12
//	    [--admin-server URL]            admin.conf server, default https://<api-endpoint>
//	    [--admin-tls-server-name NAME]  admin.conf tls-server-name
//	    [--force]                       replace a non-empty DIR
//
// # Output directory
//
//	pki/ca.crt, ca.key                  cluster CA (CN kubernetes)
//	pki/front-proxy-ca.crt, .key        front-proxy CA
//	pki/etcd/ca.crt, ca.key             etcd CA
//	pki/sa.key, sa.pub                  service-account signing key
//	admin.conf                          kubeconfig, CN kubernetes-admin O kubeadm:cluster-admins, server https://<api-endpoint>
//	bootstrap-token                     <id>.<secret>, one line
//	cluster.yaml                        what was asked (Spec) and the node list
//	<node>.ign                          Ignition v3.4 config of each node
//
// Keys, tokens, kubeconfigs and Ignition configs are 0600, certificates 0644. The whole
// directory is built next to its final place and renamed into it, so it is either
// complete or absent.
//
// # Files each Ignition config writes on its node (owner root, overwrite true)
//
// Control plane:
//
//	/etc/kiln/node.yaml                               0644 role control-plane, hostname, cluster, apiEndpoint, etcd member/members/volume, kubernetes
//	/etc/kubernetes/pki/ca.crt, ca.key                0644, 0600
//	/etc/kubernetes/pki/front-proxy-ca.crt, .key      0644, 0600
//	/etc/kubernetes/pki/etcd/ca.crt, ca.key           0644, 0600
//	/etc/kubernetes/pki/sa.key, sa.pub                0600, 0644
//	/etc/kiln/bootstrap-token                         0600 <id>.<secret>
//
// Etcd node:
//
//	/etc/kiln/node.yaml                               0644 role etcd, hostname, cluster, etcd member/members/volume
//	/etc/kubernetes/pki/etcd/ca.crt, ca.key           0644, 0600
//
// Worker:
//
//	/etc/kiln/node.yaml                               0644 role worker, hostname, cluster, apiEndpoint, kubernetes
//	/etc/kubernetes/pki/ca.crt                        0644
//	/etc/kubernetes/bootstrap-kubelet.conf            0600 server https://<api-endpoint>, user kubelet-bootstrap, the token
//
// Leaf certificates and the control plane's own kubeconfigs are made at first boot by
// kiln-init (package initd/pki), never here.
package cluster
