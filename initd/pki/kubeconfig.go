package pki

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/kilnproject/kiln/internal/kubeconfig"
)

// KubeconfigCluster is the cluster name kubeadm writes into its kubeconfigs.
const KubeconfigCluster = "kubernetes"

// controlPlaneKubeconfigNames lists the kubeconfigs ControlPlaneKubeconfigs manages.
var controlPlaneKubeconfigNames = []string{"admin.conf", "super-admin.conf", "kubelet.conf", "controller-manager.conf", "scheduler.conf"}

// controlPlaneUsers: kubeconfig file name → client certificate.
func controlPlaneUsers(hostname string) map[string]Cert {
	return map[string]Cert{
		"admin.conf":              {CommonName: "kubernetes-admin", Organization: []string{GroupClusterAdmins}, Client: true},
		"super-admin.conf":        {CommonName: "kubernetes-super-admin", Organization: []string{groupMasters}, Client: true},
		"kubelet.conf":            {CommonName: "system:node:" + hostname, Organization: []string{groupNodes}, Client: true},
		"controller-manager.conf": {CommonName: "system:kube-controller-manager", Client: true},
		"scheduler.conf":          {CommonName: "system:kube-scheduler", Client: true},
	}
}

// AdminKubeconfig makes the kubeadm admin.conf user (CN kubernetes-admin, O
// kubeadm:cluster-admins) for server, signed by ca.
func AdminKubeconfig(ca *CA, server, tlsServerName string, now time.Time) (kubeconfig.Config, error) {
	kp, err := ca.Issue(controlPlaneUsers("")["admin.conf"], now)
	if err != nil {
		return kubeconfig.Config{}, fmt.Errorf("admin kubeconfig: %w", err)
	}
	return kubeconfig.Config{Cluster: KubeconfigCluster, Server: server, CAPEM: ca.CertPEM, User: "kubernetes-admin",
		CertPEM: kp.CertPEM, KeyPEM: kp.KeyPEM, TLSServerName: tlsServerName}, nil
}

// ControlPlaneKubeconfigs is kubeadm's kubeconfig phase: admin.conf (CN kubernetes-admin,
// O kubeadm:cluster-admins), super-admin.conf (CN kubernetes-super-admin, O
// system:masters), kubelet.conf (CN system:node:<hostname>, O system:nodes),
// controller-manager.conf (CN system:kube-controller-manager) and scheduler.conf (CN
// system:kube-scheduler), each 0600 in kubeDir, all pointing at server (https://host:port)
// and signed by <pkiDir>/ca. A file that still has the same server and CA and a valid
// client certificate (CheckLeaf) is kept. It returns the file names it wrote.
func ControlPlaneKubeconfigs(kubeDir, pkiDir string, n Node, server string, now time.Time) (changed []string, err error) {
	if n.Hostname == "" {
		return nil, errors.New("control-plane kubeconfigs: node hostname is empty")
	}
	if server == "" {
		return nil, errors.New("control-plane kubeconfigs: empty server URL")
	}
	ca, err := LoadCA(pkiDir, CAName)
	if err != nil {
		return nil, err
	}
	users := controlPlaneUsers(n.Hostname)
	for _, name := range controlPlaneKubeconfigNames {
		path := filepath.Join(kubeDir, name)
		want := users[name]
		if data, err := os.ReadFile(path); err == nil {
			if kubeconfigValid(data, ca, server, want, now) {
				if err := os.Chmod(path, ModeSecret); err != nil {
					return changed, fmt.Errorf("kubeconfig %s: %w", path, err)
				}
				continue
			}
		} else if !errors.Is(err, os.ErrNotExist) {
			return changed, fmt.Errorf("kubeconfig %s: %w", path, err)
		}
		kp, err := ca.Issue(want, now)
		if err != nil {
			return changed, fmt.Errorf("kubeconfig %s: %w", path, err)
		}
		kc := kubeconfig.Config{Cluster: KubeconfigCluster, Server: server, CAPEM: ca.CertPEM, User: want.CommonName, CertPEM: kp.CertPEM, KeyPEM: kp.KeyPEM}
		data, err := kc.Marshal()
		if err != nil {
			return changed, fmt.Errorf("kubeconfig %s: %w", path, err)
		}
		if err := writeFile(path, data, ModeSecret); err != nil {
			return changed, err
		}
		changed = append(changed, name)
	}
	return changed, nil
}

func kubeconfigValid(data []byte, ca *CA, server string, want Cert, now time.Time) bool {
	k, err := kubeconfig.Parse(data)
	if err != nil || k.Server != server || k.Cluster != KubeconfigCluster || k.User != want.CommonName {
		return false
	}
	caCert, err := ParseCertPEM(k.CAPEM)
	if err != nil || !caCert.Equal(ca.Cert) {
		return false
	}
	return CheckLeaf(ca, KeyPair{CertPEM: k.CertPEM, KeyPEM: k.KeyPEM}, want, now) == nil
}

// ServerURL is https://host:port for an address as node.yaml's apiEndpoint or a bare
// IP gives it; port 6443 is added when missing.
func ServerURL(endpoint string) string {
	hp := endpoint
	for _, p := range []string{"https://", "http://"} {
		if len(hp) > len(p) && hp[:len(p)] == p {
			hp = hp[len(p):]
		}
	}
	if _, _, err := net.SplitHostPort(hp); err != nil {
		hp = net.JoinHostPort(trimBrackets(hp), "6443")
	}
	return "https://" + hp
}

func trimBrackets(s string) string {
	if len(s) > 1 && s[0] == '[' && s[len(s)-1] == ']' {
		return s[1 : len(s)-1]
	}
	return s
}
