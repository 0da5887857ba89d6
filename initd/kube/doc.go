// Package kube is what kiln-init does with Kubernetes once first boot has configured a
// node: kubeadm's init phases that need a running runtime or API server, each an
// idempotent task that checks before it acts and reports into a stage status
// (/var/lib/kiln/kube/<stage>.json, shown by `kiln-init status`).
//
//   - images (every node, before kubelet): the pre-pulled images of the OCI layout
//     /usr/lib/kiln/images are imported into containerd's k8s.io namespace, skipping those
//     present with the same digest (ImportImages).
//   - cni (every node, after kubelet): once kube-controller-manager gave the node a pod
//     CIDR, a bridge + host-local + portmap CNI configuration for it (EnsureCNI).
//   - control-plane (control-plane nodes, after kubelet): wait for the API server, the
//     kubeadm:cluster-admins binding, the bootstrap token Secret, kubeadm's TLS-bootstrap
//     RBAC, cluster-info, the control-plane label and taint, and the addons rendered into
//     /etc/kubernetes/addons (BootstrapTasks).
//
// It talks to the API with net/http and a kubeconfig (Client), not client-go.
package kube
