// Package pki is kubeadm-layout PKI: CAs, leaf certificates, kubeconfigs and bootstrap
// tokens.
//
// Layout (kubeadm's, under /etc/kubernetes/pki on a node):
//
//	ca.crt/.key                      cluster CA (CN kubernetes)
//	front-proxy-ca.crt/.key          front-proxy CA (CN front-proxy-ca)
//	etcd/ca.crt/.key                 etcd CA (CN etcd-ca)
//	sa.key, sa.pub                   service-account signing key (RSA 2048)
//	apiserver, apiserver-kubelet-client, front-proxy-client, etcd/server, etcd/peer,
//	etcd/healthcheck-client, apiserver-etcd-client   leaf certs (ControlPlaneCerts)
//
// CAs are valid 10 years, leaf certificates 1 year; all keys but the service-account key
// are ECDSA P-256 (fast to generate in emulated guests) written as PKCS#8 "PRIVATE KEY".
// Private keys are written 0600, certificates 0644, each file atomically.
//
// ControlPlaneCerts and ControlPlaneKubeconfigs are idempotent: a file that is still
// valid (signed by the current CA, more than 30 days left, same subject and names, key
// matching) is kept; anything else is re-issued. Both return what they wrote.
//
// The builder imports this package (`kiln cluster init` generates a cluster's CAs, keys and
// tokens ahead of its nodes): issuing them is node-side logic, and the builder runs it exactly
// as a control-plane node does, so the files are the same whoever made them. It is node code
// first and must never import builder/.
package pki
