package etcdmember

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"

	"github.com/kilnproject/kiln/initd/config"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

// ClientCerts are the client certificates a node asks the members with, the first that
// exists; nodeimage.EtcdCACertPath is the etcd CA both are signed by.
var ClientCerts = []string{nodeimage.EtcdClientCertAPIServer, nodeimage.EtcdClientCertHealthcheck}

// DataDir is the member's data directory node n names: its etcd volume's mount point, else
// /var/lib/etcd.
func DataDir(n *config.Node) string {
	if n.Etcd != nil && n.Etcd.Volume != nil {
		return n.Etcd.Volume.MountPath
	}
	return nodeimage.EtcdDataDir
}

// RunsMember reports whether node n runs an etcd member: a control plane whose etcd is
// not external, or an etcd node.
func RunsMember(n *config.Node) bool {
	return n != nil && n.Etcd != nil && !n.Etcd.External &&
		(n.Role == config.RoleControlPlane || n.Role == config.RoleEtcd)
}

// ForNode is the Options of node n's member, its TLS from the certificates under root. ok
// is false for a node that runs no member of several (no member, one member, no DNS zone);
// an error when the certificates are missing or unreadable.
func ForNode(root string, n *config.Node, log *slog.Logger) (o Options, ok bool, err error) {
	if !RunsMember(n) || n.Cluster.DNSZone == "" || len(n.Etcd.Members) < 2 {
		return o, false, nil
	}
	tc, err := ClientTLS(root)
	if err != nil {
		return o, false, err
	}
	self := n.InternalName("etcd-" + n.Etcd.Member)
	return Options{Name: n.Etcd.Member, Seed: n.Etcd.Seed, PeerURL: "https://" + net.JoinHostPort(self, "2380"),
		DataDir: DataDir(n), Members: StaticCluster(n), TLS: tc, Log: log}, true, nil
}

// ClientTLS is the TLS configuration a node asks the members with: the first of ClientCerts
// that exists under root, and the etcd CA.
func ClientTLS(root string) (*tls.Config, error) {
	var cert tls.Certificate
	err := fs.ErrNotExist
	for _, c := range ClientCerts {
		p := filepath.Join(root, c)
		cert, err = tls.LoadX509KeyPair(p+".crt", p+".key")
		if !errors.Is(err, fs.ErrNotExist) {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("etcd client certificate (%s or %s): %w", ClientCerts[0], ClientCerts[1], err)
	}
	caPEM, err := os.ReadFile(filepath.Join(root, nodeimage.EtcdCACertPath))
	if err != nil {
		return nil, fmt.Errorf("etcd CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("etcd CA %s: no certificate", nodeimage.EtcdCACertPath)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool, MinVersion: tls.VersionTLS12}, nil
}
