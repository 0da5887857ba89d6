// Package cloud is what kiln-init needs of a cloud platform on the node, behind one
// interface: its config source, the instance's identity, its etcd volume and its DNS
// service. Each cloud is a package of its own below this one (cloud/aws, cloud/gce)
// whose Cloud implements Cloud; first boot keeps the list of them. A cloud's node.yaml
// fields stay in package config.
package cloud

import (
	"context"
	"log/slog"
	"strings"

	"github.com/kilnproject/kiln/initd/config"
	"github.com/kilnproject/kiln/initd/dns"
	"github.com/kilnproject/kiln/initd/etcdvolume"
	"github.com/kilnproject/kiln/initd/source"
)

// Instance is what first boot learns of the machine from its cloud's metadata service.
type Instance struct {
	Cloud        string // the cloud's Name: "aws", "gce"
	InstanceID   string
	Zone         string
	Hostname     string // the first label of the name the cloud gives the instance; "" if none
	InstanceName string // GCE: the instance name, which the compute API takes
	Project      string // GCE: the project id
}

// Cloud is a cloud platform on the node.
type Cloud interface {
	// Name is the cloud's kiln.platform= value, e.g. "aws".
	Name() string
	// Source is the config source that reads the instance's user data.
	Source() source.Provider
	// Identify asks the metadata service who this instance is; n (nil before the node
	// config is known) may point the metadata service elsewhere.
	Identify(ctx context.Context, n *config.Node) (Instance, error)
	// SelectsVolume reports whether v's selector is this cloud's (EBS tags, GCE disk).
	SelectsVolume(v *config.Volume) bool
	// EtcdVolume is the finder of the etcd volume v selects, for instance in, through
	// the cloud's API with the instance's credentials.
	EtcdVolume(ctx context.Context, n *config.Node, v *config.Volume, in Instance, log *slog.Logger) (etcdvolume.Finder, error)
	// DNS is the provider of n's dns.provider when it is this cloud's DNS service, else
	// nil, nil.
	DNS(ctx context.Context, n *config.Node) (dns.Provider, error)
}

// FirstLabel is a host name's first label: ip-10-0-1-5.eu-west-1.compute.internal →
// ip-10-0-1-5, so the node name a cloud gives has no private domain.
func FirstLabel(name string) string {
	first, _, _ := strings.Cut(strings.TrimSpace(name), ".")
	return first
}
