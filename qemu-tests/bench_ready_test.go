package qemutests

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"text/template"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/kilnproject/kiln/builder/vm"
	"github.com/kilnproject/kiln/initd/pki"
	"github.com/kilnproject/kiln/internal/atomicfile"
	"github.com/kilnproject/kiln/internal/testkit"
)

// Boot-to-Ready, side by side (make bench-ready, KILN_BENCH_READY=1): kiln's control plane
// and worker against the path most clusters take instead — a generic Debian image with
// cloud-init that installs containerd, runc, the CNI plugins, crictl, kubelet and kubeadm
// from an HTTP mirror and runs kubeadm init / kubeadm join, pulling its images from a
// registry. Both clusters: the same Kubernetes built from source, the same registry's
// images, the same VM sizes, the same cluster link, one after the other on the same host,
// TCG; the worker starts once the control plane is Ready (bootPair).
//
// The reference image is make bench's cloud-init image (bench/cloudinit.yaml: the kiln
// base, Debian bookworm, with cloud-init and without kiln-firstboot): Debian's own generic
// cloud image cannot be fetched here, and the same base keeps the kernel, systemd and disk
// out of the comparison — it measures installing at boot against baking.

const (
	refCluster = "ref"
	// refUpLine is the reference nodes' first line of their own on the console: cloud-init's
	// runcmd started the install.
	refUpLine = "kiln-ref: installing"
	// refFailedLine is printed when the install or kubeadm fails; the test stops there.
	refFailedLine = "kiln-ref: failed"
)

func TestBenchReady(t *testing.T) {
	if os.Getenv("KILN_BENCH_READY") != "1" {
		t.Skip("the boot-to-Ready comparison runs with make bench-ready (KILN_BENCH_READY=1)")
	}
	e := newRepoEnv(t)
	root := repoRoot(t)
	out, bin := bakeE2EImages(t, e, false)
	e2eStep(t, "kubeadm built from source", func() {
		e.run(root, "bash", "qemu-tests/e2e/build-components.sh", "kubeadm")
	})
	e2eStep(t, "the cloud-init image baked (bench/cloudinit.yaml)", func() {
		e.run(root, "cp", "-a", filepath.Join(root, "bench"), filepath.Join(e.repo, "bench"))
		e.run(e.repo, e.kiln, "lock", "--update", "bench/cloudinit.yaml")
		e.run(e.repo, e.kiln, "bake", "bench/cloudinit.yaml", "--role", "worker", "-o", out)
	})

	// The reference first: it is the one that may not come up.
	ref := bootPair(t, e, kubeadmNodePair(t, e, filepath.Join(out, "bench-cloudinit-worker.raw"), bin))
	ref.CPVM.Stop()
	ref.WorkerVM.Stop()
	kiln := bootPair(t, e, kilnNodePair(t, e, out, bin, false))

	row := func(what string, k, r time.Duration) string {
		return fmt.Sprintf("  %-34s %8s %8s %7.2f", what, k.Round(time.Second), r.Round(time.Second), k.Seconds()/r.Seconds())
	}
	t.Logf("boot-to-Ready, kiln vs cloud-init + kubeadm (TCG, %d host cores; from each VM's start, the cluster's from the control plane's):\n  %-34s %8s %8s %7s\n%s\n%s\n%s\n%s",
		runtime.NumCPU(), "", "kiln", "kubeadm", "ratio",
		row("control plane: API ready", kiln.APIReady, ref.APIReady),
		row("control plane: node Ready", kiln.CPReady, ref.CPReady),
		row("worker: node Ready", kiln.WorkerReady, ref.WorkerReady),
		row("cluster: both Ready", kiln.BothReady(), ref.BothReady()))
}

// refComponents are what the reference nodes fetch from the mirror: the e2e's artifacts
// (the same builds kiln bakes) and kubeadm.
var refComponents = []string{"containerd-linux-amd64.tar.gz", "runc.amd64", "cni-plugins-linux-amd64.tgz",
	"crictl-linux-amd64.tar.gz", "kubelet", "kubeadm"}

// kubeadmNodePair prepares the reference cluster: a mirror of the components served over
// HTTP, a cluster CA made on the host (kubeadm uses a CA it finds in /etc/kubernetes/pki,
// and the host's kubectl then trusts the cluster), a bootstrap token, and each node's
// cloud-init user-data on a CIDATA disk.
func kubeadmNodePair(t *testing.T, e *env, image, bin string) nodePair {
	t.Helper()
	mirror := filepath.Join(e.dir, "mirror")
	url := serveDir(t, mirror)
	sums := map[string]string{}
	for _, name := range refComponents {
		src := filepath.Join(e.dir, "artifacts", name)
		if name == "kubeadm" {
			src = filepath.Join(bin, name)
		}
		dst := filepath.Join(mirror, name)
		if err := atomicfile.Copy(src, dst, atomicfile.Options{Mode: 0o644, DirMode: 0o755}); err != nil {
			t.Fatal(err)
		}
		sums[name] = testkit.FileSHA256(t, dst)
	}
	now := time.Now()
	caKP, err := pki.NewCA("kubernetes", now)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := pki.ParseCA(caKP)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := pki.NewToken()
	if err != nil {
		t.Fatal(err)
	}
	apiPort := testkit.FreePort(t)
	admin, err := pki.AdminKubeconfig(ca, fmt.Sprintf("https://127.0.0.1:%d", apiPort), "kubernetes", now)
	if err != nil {
		t.Fatal(err)
	}
	adminYAML, err := admin.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	adminConf := filepath.Join(e.dir, "ref-admin.conf")
	if err := os.WriteFile(adminConf, adminYAML, 0o600); err != nil {
		t.Fatal(err)
	}
	caHash := sha256.Sum256(ca.Cert.RawSubjectPublicKeyInfo)

	link := fmt.Sprintf("%s-ref-%d", e2eLinkPrefix, os.Getpid())
	cpName, workerName := refCluster+"-cp-1", refCluster+"-worker-1"
	node := func(name, addr, podCIDR string, secrets []refFile) string {
		ud, err := refUserData(refNode{
			Name: name, Addr: addr, MAC: linkMAC(addr), PodCIDR: podCIDR,
			Mirror: strings.Replace(url, "127.0.0.1", "10.0.2.2", 1), Sums: sums,
			Init: name == cpName, Token: tok.String(), APIAddr: cpAddr, CAHash: hex.EncodeToString(caHash[:]),
		}, secrets)
		if err != nil {
			t.Fatal(err)
		}
		dir := filepath.Join(e.dir, "cidata-"+name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		iso, err := makeCIDATA(dir, map[string][]byte{
			"user-data":      ud,
			"network-config": []byte(fmt.Sprintf(refNetwork, linkMAC(addr), addr)),
			"meta-data":      []byte("instance-id: " + name + "\nlocal-hostname: " + name + "\n"),
		})
		if err != nil {
			t.Fatal(err)
		}
		return iso
	}
	cpISO := node(cpName, cpAddr, "10.244.0.0/24", []refFile{
		{Path: "/etc/kubernetes/pki/ca.crt", Content: string(caKP.CertPEM), Perm: "0644"},
		{Path: "/etc/kubernetes/pki/ca.key", Content: string(caKP.KeyPEM), Perm: "0600"},
	})
	workerISO := node(workerName, workerAddr, "10.244.1.0/24", nil)

	return nodePair{
		CPName: cpName, WorkerName: workerName,
		Kubectl: kubectlAt(filepath.Join(bin, "kubectl"), adminConf, apiPort),
		CP: vm.Config{
			Image: image, Snapshot: true, MemoryMB: 3072, CPUs: 2,
			Disks:   []vm.Disk{{Name: "cidata", Path: cpISO}},
			Links:   []vm.Link{{Name: link, MAC: linkMAC(cpAddr)}},
			Forward: map[string]int{fmt.Sprintf("127.0.0.1:%d", apiPort): 6443},
		},
		Worker: vm.Config{
			Image: image, Snapshot: true, MemoryMB: 2048, CPUs: 2,
			Disks: []vm.Disk{{Name: "cidata", Path: workerISO}},
			Links: []vm.Link{{Name: link, MAC: linkMAC(workerAddr)}},
		},
		Up:   regexp.MustCompile(regexp.QuoteMeta(refUpLine)),
		Fail: regexp.MustCompile(regexp.QuoteMeta(refFailedLine) + ".*"),
	}
}

// refKubeadm is a node's kubeadm configuration. The control plane's (Init): the bootstrap
// token the worker joins with, the address on the cluster link, the etcd and CoreDNS the
// registry holds, and the same slow-control-plane timings kiln's e2e cluster gets (leases,
// etcd's Raft), for TCG. The worker's: discovery by token, the CA pinned by its key's hash.
// Both: containerd's socket, the node's IP on the cluster link, and kubeadm's waits long
// enough for emulated CPUs.
var refKubeadm = template.Must(template.New("kubeadm").Parse(`apiVersion: kubeadm.k8s.io/v1beta4
{{if .Init -}}
kind: InitConfiguration
bootstrapTokens:
  - token: "{{.Token}}"
    ttl: 2h0m0s
localAPIEndpoint:
  advertiseAddress: {{.Addr}}
  bindPort: 6443
{{- else -}}
kind: JoinConfiguration
discovery:
  bootstrapToken:
    apiServerEndpoint: {{.APIAddr}}:6443
    token: "{{.Token}}"
    caCertHashes: ["sha256:{{.CAHash}}"]
{{- end}}
nodeRegistration:
  name: {{.Name}}
  criSocket: unix:///run/containerd/containerd.sock
  kubeletExtraArgs:
    - {name: node-ip, value: {{.Addr}}}
  ignorePreflightErrors: [SystemVerification]
timeouts:
  kubeletHealthCheck: 20m0s
{{- if .Init}}
  controlPlaneComponentHealthCheck: 20m0s
  kubernetesAPICall: 20m0s
---
apiVersion: kubeadm.k8s.io/v1beta4
kind: ClusterConfiguration
kubernetesVersion: v1.37.2
clusterName: ref
controlPlaneEndpoint: {{.APIAddr}}:6443
apiServer:
  certSANs: [127.0.0.1, kubernetes]
controllerManager:
  extraArgs:
    - {name: leader-elect-lease-duration, value: 60s}
    - {name: leader-elect-renew-deadline, value: 40s}
    - {name: leader-elect-retry-period, value: 5s}
scheduler:
  extraArgs:
    - {name: leader-elect-lease-duration, value: 60s}
    - {name: leader-elect-renew-deadline, value: 40s}
    - {name: leader-elect-retry-period, value: 5s}
etcd:
  local:
    imageTag: 3.6.16-0
    extraArgs:
      - {name: heartbeat-interval, value: "500"}
      - {name: election-timeout, value: "5000"}
dns:
  imageTag: v1.15.0
networking:
  podSubnet: 10.244.0.0/16
  serviceSubnet: 10.96.0.0/12
---
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: systemd
{{- else}}
  tlsBootstrap: 20m0s
  discovery: 20m0s
{{- end}}
`))

// refNode is what one reference node's user-data says.
type refNode struct {
	Name, Addr, MAC, PodCIDR string
	Mirror                   string            // the components' HTTP mirror, as the guest reaches it
	Sums                     map[string]string // component file → sha256
	Init                     bool              // kubeadm init (else join)
	Token                    string            // the bootstrap token
	APIAddr                  string            // the control plane's address
	CAHash                   string            // the cluster CA's key hash, hex (join)
}

// refFile is one cloud-init write_files entry.
type refFile struct {
	Path    string `yaml:"path"`
	Content string `yaml:"content"`
	Perm    string `yaml:"permissions"`
}

// refUserData renders a reference node's #cloud-config: the files a kubeadm install guide
// has a user write (runtime and kubelet units, containerd's config and registry mirror,
// kernel modules and sysctls, a bridge CNI config, kubeadm's config) and a runcmd that
// fetches and verifies the components, starts containerd and runs kubeadm.
func refUserData(n refNode, secrets []refFile) ([]byte, error) {
	var script, kubeadm bytes.Buffer
	if err := refInstall.Execute(&script, n); err != nil {
		return nil, err
	}
	if err := refKubeadm.Execute(&kubeadm, n); err != nil {
		return nil, err
	}
	files := []refFile{
		{Path: "/etc/containerd/config.toml", Perm: "0644", Content: refContainerdConfig},
		{Path: "/etc/containerd/certs.d/registry.k8s.io/hosts.toml", Perm: "0644", Content: registryMirror},
		{Path: "/etc/systemd/system/containerd.service", Perm: "0644", Content: refContainerdUnit},
		{Path: "/etc/systemd/system/kubelet.service", Perm: "0644", Content: refKubeletUnit},
		{Path: "/etc/systemd/system/kubelet.service.d/10-kubeadm.conf", Perm: "0644", Content: refKubeadmDropIn},
		{Path: "/etc/modules-load.d/k8s.conf", Perm: "0644", Content: "overlay\nbr_netfilter\n"},
		{Path: "/etc/sysctl.d/90-k8s.conf", Perm: "0644",
			Content: "net.ipv4.ip_forward = 1\nnet.bridge.bridge-nf-call-iptables = 1\nnet.bridge.bridge-nf-call-ip6tables = 1\n"},
		{Path: "/etc/cni/net.d/10-bridge.conflist", Perm: "0644", Content: fmt.Sprintf(refCNI, n.PodCIDR)},
		{Path: "/etc/kubeadm/config.yaml", Perm: "0600", Content: kubeadm.String()},
		{Path: "/usr/local/sbin/k8s-install", Perm: "0755", Content: script.String()},
	}
	files = append(files, secrets...)
	doc := map[string]any{
		"hostname":         n.Name,
		"manage_etc_hosts": true,
		"write_files":      files,
		"runcmd":           [][]string{{"/usr/local/sbin/k8s-install"}},
	}
	b, err := yaml.Marshal(doc)
	if err != nil {
		return nil, err
	}
	return append([]byte("#cloud-config\n"), b...), nil
}

// refInstall is the install runcmd runs: each download checked against its sha256 before
// use (python3, which cloud-init brings), then kubeadm.
var refInstall = template.Must(template.New("install").Parse(`#!/bin/sh
set -eu
say() { echo "kiln-ref: $*" > /dev/console; }
diag() {
  tail -n 30 /var/log/kubeadm.log > /dev/console 2>&1 || true
  crictl ps -a > /dev/console 2>&1 || true
  for c in kube-apiserver etcd; do
    id=$(crictl ps -a --name "$c" -q 2>/dev/null | head -n 1)
    [ -z "$id" ] || crictl logs --tail 15 "$id" 2>&1 | sed "s/^/$c: /" > /dev/console
  done
  journalctl -u kubelet --no-pager 2>&1 | grep -v '^--' | tail -n 15 > /dev/console || true
  say "failed"
}
trap diag EXIT
say "installing {{.Name}}"
# The address on the cluster link (network-config): up before kubeadm binds to it.
for i in /sys/class/net/*; do
  if [ "$(cat "$i/address")" = "{{.MAC}}" ]; then link=${i##*/}; fi
done
n=0
until ip -4 -o addr show dev "$link" | grep -q " {{.Addr}}/"; do
  n=$((n + 1)); [ $n -lt 120 ] || { say "no address {{.Addr}} on $link"; exit 1; }
  sleep 1
done
# kubelet gives pods the host's resolv.conf; the image has none until a resolver writes one
# (networkd alone does not): QEMU's user network has its name server at 10.0.2.3.
[ -e /etc/resolv.conf ] || { rm -f /etc/resolv.conf; echo "nameserver 10.0.2.3" > /etc/resolv.conf; }
fetch() {
  python3 - "{{.Mirror}}/$1" "$2" "/tmp/$1" <<'PY'
import hashlib, sys, urllib.request
url, want, dest = sys.argv[1:]
data = urllib.request.urlopen(url, timeout=120).read()
got = hashlib.sha256(data).hexdigest()
if got != want:
    sys.exit(f"{url}: sha256 {got}, want {want}")
with open(dest, "wb") as f:
    f.write(data)
PY
}
{{range $f, $sum := .Sums}}fetch {{$f}} {{$sum}}
{{end -}}
tar -C /usr/local -xzf /tmp/containerd-linux-amd64.tar.gz
install -m 0755 /tmp/runc.amd64 /usr/local/sbin/runc
mkdir -p /opt/cni/bin && tar -C /opt/cni/bin -xzf /tmp/cni-plugins-linux-amd64.tgz
tar -C /usr/local/bin -xzf /tmp/crictl-linux-amd64.tar.gz
install -m 0755 /tmp/kubelet /tmp/kubeadm /usr/local/bin/
rm -f /tmp/*.tar.gz /tmp/*.tgz /tmp/runc.amd64 /tmp/kubelet /tmp/kubeadm
modprobe overlay
modprobe br_netfilter
sysctl --system > /dev/null
systemctl daemon-reload
systemctl enable --now containerd.service
systemctl enable kubelet.service
say "installed; kubeadm {{if .Init}}init{{else}}join{{end}}"
# While kubeadm runs, the console says every minute how far the node got.
export CONTAINER_RUNTIME_ENDPOINT=unix:///run/containerd/containerd.sock
(while sleep 60; do
  say "$(tail -n 1 /var/log/kubeadm.log); containers: $(crictl ps -a 2>/dev/null | awk 'NR > 1 {print $(NF-4) "=" $(NF-5)}' | tr '\n' ' ')"
  journalctl -u kubelet -u containerd --since -60s --no-pager 2>/dev/null | grep -e ' E[0-9]' -e 'level=error' | grep -v -e 'mirror pod' -e 'not found' | tail -n 4 | cut -c 1-400 > /dev/console
done) &
kubeadm {{if .Init}}init{{else}}join{{end}} --config /etc/kubeadm/config.yaml > /var/log/kubeadm.log 2>&1
kill $! 2>/dev/null || true
trap - EXIT
say "kubeadm done"
`))

// refNetwork is the node's NoCloud network-config, applied by cloud-init before the network
// starts: the address on the cluster link (the link holds the default route, as on kiln's
// nodes) and DHCP on the user network's NIC (enp0s24), through which the mirror and the
// registry on the host are reached. Arguments: the link's MAC, the address.
const refNetwork = `version: 2
ethernets:
  link:
    match: {macaddress: "%s"}
    addresses: [%s/24]
    gateway4: 192.168.100.1
  user:
    match: {name: enp0s24}
    dhcp4: true
`

// refContainerdConfig is containerd's config as kiln renders it (systemd cgroups, the pause
// image, registry hosts in certs.d), with the CNI plugins where their tarball goes.
const refContainerdConfig = `version = 3
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "registry.k8s.io/pause:3.10.2"
  [plugins.'io.containerd.cri.v1.images'.registry]
    config_path = "/etc/containerd/certs.d"
[plugins.'io.containerd.cri.v1.runtime']
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
      SystemdCgroup = true
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["/opt/cni/bin"]
    conf_dir = "/etc/cni/net.d"
`

const refContainerdUnit = `[Unit]
Description=containerd container runtime
After=network.target local-fs.target
[Service]
ExecStartPre=-/sbin/modprobe overlay
ExecStart=/usr/local/bin/containerd
Type=notify
Delegate=yes
KillMode=process
Restart=always
RestartSec=5
LimitNPROC=infinity
LimitCORE=infinity
TasksMax=infinity
OOMScoreAdjust=-999
[Install]
WantedBy=multi-user.target
`

const refKubeletUnit = `[Unit]
Description=kubelet: The Kubernetes Node Agent
Wants=network-online.target containerd.service
After=network-online.target containerd.service
StartLimitIntervalSec=0
[Service]
ExecStart=/usr/local/bin/kubelet
Restart=always
RestartSec=10
[Install]
WantedBy=multi-user.target
`

// refKubeadmDropIn is the drop-in kubeadm's install guide has kubelet run with: kubeadm
// writes the flags file and the config, kubelet restarts until they exist.
const refKubeadmDropIn = `[Service]
Environment="KUBELET_KUBECONFIG_ARGS=--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf --kubeconfig=/etc/kubernetes/kubelet.conf"
Environment="KUBELET_CONFIG_ARGS=--config=/var/lib/kubelet/config.yaml"
EnvironmentFile=-/var/lib/kubelet/kubeadm-flags.env
ExecStart=
ExecStart=/usr/local/bin/kubelet $KUBELET_KUBECONFIG_ARGS $KUBELET_CONFIG_ARGS $KUBELET_KUBEADM_ARGS $KUBELET_EXTRA_ARGS
`

// refCNI is a bridge network over the node's pod range (kiln's nodes render the same from
// the range the controller-manager allocates). Argument: the range.
const refCNI = `{
  "cniVersion": "1.0.0",
  "name": "ref",
  "plugins": [
    {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": true, "hairpinMode": true,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": "%s"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
`
