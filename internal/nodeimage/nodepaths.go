package nodeimage

// Paths on a running node that more than one part of kiln writes or reads: the cluster
// generator puts files there in a node's config, first boot writes them, later services read
// them. Each is absolute, relative to the node's root; code that works on a mounted tree
// (tests, the installer) joins it under that root. The Kubernetes ones are kubeadm's layout.
// What the bake lays in the image (templates, images, the image metadata) is in layout.go.
const (
	// NodeConfigPath is the typed kiln node config (initd/config's Node).
	NodeConfigPath = "/etc/kiln/node.yaml"
	// BootstrapTokenPath holds a control plane's bootstrap token (0600), which its bootstrap
	// creates in the cluster and workers join with.
	BootstrapTokenPath = "/etc/kiln/bootstrap-token"

	// StateDir is kiln's own state on the data partition: the overlays' upper directories
	// (Overlays) and the files below.
	StateDir = "/var/lib/kiln"
	// StatusPath is first boot's status, which kiln-init status prints.
	StatusPath = StateDir + "/status.json"
	// DNSStatusPath is the DNS names' registration status.
	DNSStatusPath = StateDir + "/dns.json"
	// StorageStatePath records what the config's storage section made.
	StorageStatePath = StateDir + "/storage.json"
	// KubeStageDir holds what first boot stages for kubelet's start (the images' import
	// state).
	KubeStageDir = StateDir + "/kube"

	// KubeDir is Kubernetes' configuration directory.
	KubeDir = "/etc/kubernetes"
	// KubePKIDir holds the cluster's and the node's certificates and keys.
	KubePKIDir = KubeDir + "/pki"
	// KubeCACertPath is the cluster CA's certificate.
	KubeCACertPath = KubePKIDir + "/ca.crt"
	// EtcdCACertPath is the etcd CA's certificate.
	EtcdCACertPath = KubePKIDir + "/etcd/ca.crt"
	// EtcdClientCertAPIServer and EtcdClientCertHealthcheck are the client certificates a
	// node asks etcd's members with (without the .crt/.key suffix), the first that exists: a
	// control plane's API server's, else an etcd node's health-check client.
	EtcdClientCertAPIServer   = KubePKIDir + "/apiserver-etcd-client"
	EtcdClientCertHealthcheck = KubePKIDir + "/etcd/healthcheck-client"
	// ManifestsDir is kubelet's static pod directory.
	ManifestsDir = KubeDir + "/manifests"
	// RenderedEtcdManifestPath is where the role's templates put the etcd member's manifest,
	// before first boot moves it onto the etcd volume.
	RenderedEtcdManifestPath = KubeDir + "/etcd/etcd.manifest"
	// AddonsDir holds the rendered addon manifests (kube-proxy, CoreDNS), applied in name
	// order by a control plane's bootstrap.
	AddonsDir = KubeDir + "/addons"
	// AdminConfPath and SuperAdminConfPath are a control plane's admin kubeconfigs.
	AdminConfPath      = KubeDir + "/admin.conf"
	SuperAdminConfPath = KubeDir + "/super-admin.conf"
	// KubeletConfPath is kubelet's kubeconfig; BootstrapKubeletConfPath the bootstrap one a
	// joining node's kubelet starts with.
	KubeletConfPath          = KubeDir + "/kubelet.conf"
	BootstrapKubeletConfPath = KubeDir + "/bootstrap-kubelet.conf"
	// KubeletClientCertPath is the client certificate kubelet's TLS bootstrap ends with.
	KubeletClientCertPath = "/var/lib/kubelet/pki/kubelet-client-current.pem"

	// ContainerdSocket is containerd's socket: its CRI endpoint, and where Docker Engine's
	// image store reaches it.
	ContainerdSocket = "/run/containerd/containerd.sock"

	// CNIConfPath is the bridge network's CNI configuration kiln-cni writes.
	CNIConfPath = "/etc/cni/net.d/10-kiln-bridge.conflist"
	// CNIBinDir holds the CNI plugins.
	CNIBinDir = "/opt/cni/bin"

	// EtcdDataDir is etcd's data directory when no etcd volume is mounted; an etcd volume
	// is mounted at EtcdDataDir/<cluster name>.
	EtcdDataDir = "/var/lib/etcd"
)
