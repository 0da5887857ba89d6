package qemutests

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kilnproject/kiln/builder/vm"
	"github.com/kilnproject/kiln/internal/cloudfake"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

// The guest's user network in the cloud boots: the host (QEMU's slirp, which passes the
// guest's connections to it on to the host's loopback) sits at the clouds' metadata address,
// and the guest gets an ordinary (not link-local) address beside it.
const (
	metadataIP = "169.254.169.254"
	cloudNet   = "169.254.0.0/15"
	guestIP    = "169.255.0.15"
)

// cloudBoot is one boot as a cloud would do it: the image, how its disks sit, the fakes
// the guest reaches at metadataIP, and what to check afterwards.
type cloudBoot struct {
	def        string
	root       vm.Disk
	userData   func(ports map[string]int) string
	metadata   http.Handler
	apis       map[string]http.Handler // name → fake, each on its own port
	etcdSerial string                  // the etcd disk's serial once hotplugged
}

// Boots that behave like each cloud (TCG): the image of the cloud's definition, for a control
// plane, boots with its root disk on the cloud's bus and no config but what the metadata
// service at 169.254.169.254 serves; its etcd disk is found through the cloud's API, which
// hotplugs it into the running VM (QMP) as the cloud attaches a volume, and its names go to
// the cloud's DNS. Each reaches `firstboot ok` with the disk formatted and mounted, the names
// readable from the fake DNS and the hostname from the metadata service.
func TestCloudBoots(t *testing.T) {
	top := newEnv(t)
	for _, def := range []string{"aws", "gce"} {
		forTCG(t, filepath.Join(top.repo, "images", def+".yaml"))
	}
	sub := func(t *testing.T) *env { e := *top; e.t = t; return &e }
	t.Run("ec2", func(t *testing.T) { testEC2Boot(t, sub(t)) })
	t.Run("gce", func(t *testing.T) { testGCEBoot(t, sub(t)) })
}

// forTCG makes a cloud definition quick to bake and boot under TCG: the raw disk only (no
// vmdk or tarball conversion) and tsc=reliable (see images/qemu.yaml) on the command line.
func forTCG(t *testing.T, def string) {
	t.Helper()
	b, err := os.ReadFile(def)
	if err != nil {
		t.Fatal(err)
	}
	s := regexp.MustCompile(`(?m)^formats: .*$`).ReplaceAllString(string(b), "formats: [raw]")
	s = strings.Replace(s, "\n  args:\n", "\n  args:\n    - tsc=reliable\n", 1)
	if !strings.Contains(s, "tsc=reliable") || !strings.Contains(s, "formats: [raw]") {
		t.Fatalf("%s: no kernel.args list or formats line to adjust", def)
	}
	if err := os.WriteFile(def, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

// cloudNode is the control plane's Ignition config: node.yaml for cluster demo (member a of
// a, the etcd disk as the cloud selects it), provider and API endpoints as given.
func cloudNode(etcdVolume, dns, cloud string) string {
	node := fmt.Sprintf("cluster: {name: demo, dnsZone: kiln.test}\nrole: control-plane\ndns: %s\netcd: {member: a, members: [a], volume: %s}\n%s\n",
		dns, etcdVolume, cloud)
	return fmt.Sprintf(`{"ignition":{"version":"3.4.0"},"storage":{"files":[{"path":"/etc/kiln/node.yaml","mode":420,"contents":{"source":"data:;base64,%s"}}]}}`,
		base64.StdEncoding.EncodeToString([]byte(node)))
}

// listenMetadata listens on 127.0.0.1:80, where QEMU's user network takes the guest's
// connections to 169.254.169.254:80.
func listenMetadata(t *testing.T, h http.Handler) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:80")
	if errors.Is(err, syscall.EADDRINUSE) {
		t.Fatalf("127.0.0.1:80 is taken: the metadata fake must listen there (the guest reaches it as %s:80)", metadataIP)
	}
	if err != nil {
		t.Fatalf("listen on 127.0.0.1:80 for the metadata fake (root needed): %v", err)
	}
	serve(t, ln, h)
}

// listenAPI serves h on a free port of 127.0.0.1 and returns the port.
func listenAPI(t *testing.T, h http.Handler) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	serve(t, ln, h)
	return ln.Addr().(*net.TCPAddr).Port
}

func serve(t *testing.T, ln net.Listener, h http.Handler) {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
}

// sparseDisk creates an empty raw disk of size bytes.
func sparseDisk(t *testing.T, path string, size int64) {
	t.Helper()
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, size); err != nil {
		t.Fatal(err)
	}
}

// bootCloud bakes def for the control plane and boots it with cfg's disks and network:
// the metadata fake on 127.0.0.1:80, a QMP socket for hotplug, a PCIe root port free for
// an NVMe disk. It waits for first boot's outcome and then for the DNS registration, and
// returns the machine (stopped) and the image.
func bootCloud(t *testing.T, e *env, def string, cfg vm.Config) (*vm.Machine, string, time.Duration) {
	baked := e.bake(def, "control-plane")
	cfg.Image = filepath.Join(e.dir, def+"-cp-a.raw")
	copySparse(t, baked, cfg.Image)
	cfg.Net, cfg.NetHost, cfg.NetDHCPStart = cloudNet, metadataIP, guestIP
	cfg.Extra = append(cfg.Extra, "-device", "pcie-root-port,id=hotplug0,chassis=9")
	start := time.Now()
	m, line := e.bootWith(cfg, firstbootDone, 25*time.Minute)
	took := time.Since(start)
	if firstbootOutcome(line) != nodeimage.OutcomeOK {
		m.Stop()
		t.Fatalf("%s: %s\n%s", def, line, tail(m.Lines(), 60))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if l, err := m.WaitFor(ctx, dnsDone); err != nil || firstbootOutcome(l) == nodeimage.OutcomeFailed {
		t.Errorf("no DNS registration: %q %v\n%s", l, err, tail(m.Lines(), 40))
	}
	m.Stop()
	return m, cfg.Image, took
}

// hotplug returns the attach function of a cloud fake: the disk at path joins the running VM
// through QMP as device dev.
func hotplug(t *testing.T, sock, path string, dev map[string]any) func() error {
	return func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		q, err := dialQMP(ctx, sock)
		if err != nil {
			return err
		}
		defer q.conn.Close()
		if err := q.do("blockdev-add", map[string]any{"driver": "raw", "node-name": "etcd",
			"file": map[string]any{"driver": "file", "filename": path}}); err != nil {
			return err
		}
		dev["id"], dev["drive"] = "etcd-disk", "etcd"
		if err := q.do("device_add", dev); err != nil {
			return err
		}
		t.Logf("hotplugged %s as %v", filepath.Base(path), dev)
		return nil
	}
}

// checkNode checks, from the powered-off disks, what first boot did: the status it recorded
// (hostname from the platform, instance, zone), the etcd disk formatted with etcd's
// manifest on it.
func checkNode(t *testing.T, e *env, image, etcdDisk, hostname, instance, zone string) {
	t.Helper()
	raw, err := e.dataFile(image, "/lib/kiln/status.json")
	if err != nil {
		t.Fatalf("first-boot status: %v", err)
	}
	var st struct{ State, Hostname, HostnameSource, InstanceID, Zone, Platform string }
	if err := json.Unmarshal([]byte(raw), &st); err != nil {
		t.Fatalf("status.json: %v\n%s", err, raw)
	}
	if st.State != "ok" || st.Hostname != hostname || st.HostnameSource != "platform" || st.InstanceID != instance || st.Zone != zone {
		t.Errorf("status: %+v; want hostname %s from the platform, instance %s in %s", st, hostname, instance, zone)
	}
	out, _ := exec.Command("blkid", "-p", etcdDisk).CombinedOutput()
	if !strings.Contains(string(out), `TYPE="ext4"`) || !strings.Contains(string(out), `LABEL="etcd"`) {
		t.Errorf("etcd disk: blkid says %s", out)
	}
	if out, err := exec.Command("debugfs", "-R", "stat /manifests/etcd.manifest", etcdDisk).CombinedOutput(); err != nil || strings.Contains(string(out), "not found") {
		t.Errorf("no etcd manifest on the etcd disk: %v %s", err, out)
	}
}

// consoleHas reports whether a console line contains each of subs, in order.
func consoleHas(lines []string, subs ...string) bool {
	i := 0
	for _, l := range lines {
		if i < len(subs) && strings.Contains(l, subs[i]) {
			i++
		}
	}
	return i == len(subs)
}

// noRefusals fails t with the requests the fake of what refused: the node sent requests
// the cloud would refuse.
func noRefusals(t *testing.T, what string, refused []string) {
	t.Helper()
	if len(refused) > 0 {
		t.Errorf("%s refused requests: %s", what, strings.Join(slices.Compact(refused), "; "))
	}
}

// roleCreds are the temporary credentials of the instance role: the IMDS fake hands them
// out, the EC2 and Route 53 fakes accept requests signed with them and nothing else.
var roleCreds = cloudfake.AWSCredentials{AccessKeyID: "ASIAKILNTESTROLE0001", SecretAccessKey: "kiln-role-secret", SessionToken: "kiln-session-token"}

// testEC2Boot: the aws image on an "EC2" instance: root volume on NVMe, IMDSv2 required,
// the etcd volume found by its kOps tags and attached through EC2 (an NVMe disk whose serial
// is the volume id without the dash), the names in a Route 53 hosted zone.
func testEC2Boot(t *testing.T, e *env) {
	const volID, instanceID, az = "vol-0a1b2c3d4e5f60718", "i-0kiln0123456789ab", "eu-west-1a"
	etcdDisk := filepath.Join(e.dir, "ebs-etcd-a.img")
	sparseDisk(t, etcdDisk, 2<<30)
	sock := filepath.Join(e.dir, "ec2-qmp.sock")
	ec2 := &cloudfake.EC2{Creds: roleCreds, Region: "eu-west-1", Instances: map[string]string{instanceID: az}, Volumes: []*cloudfake.EC2Volume{
		{ID: volID, AZ: az, State: "available", SizeGiB: 2, Tags: map[string]string{
			"k8s.io/etcd/main": "a/a", "kubernetes.io/cluster/demo": "owned", "k8s.io/role/master": "1"}},
		// Member a's volume of another cluster, and one in another zone: never attached.
		{ID: "vol-0ffff0000000000a1", AZ: az, State: "available", SizeGiB: 2, Tags: map[string]string{
			"k8s.io/etcd/main": "a/a", "kubernetes.io/cluster/other": "owned"}},
		{ID: "vol-0ffff0000000000b2", AZ: "eu-west-1b", State: "available", SizeGiB: 2, Tags: map[string]string{
			"k8s.io/etcd/main": "a/a", "kubernetes.io/cluster/demo": "owned"}},
	}}
	plug := hotplug(t, sock, etcdDisk, map[string]any{"driver": "nvme", "bus": "hotplug0", "serial": strings.ReplaceAll(volID, "-", "")})
	ec2.Attach = func(string, string) error { return plug() }
	r53 := &cloudfake.Route53{Creds: roleCreds, ZoneID: "Z0KILNTEST0001", Zone: "kiln.test."}
	ec2Port, r53Port := listenAPI(t, ec2), listenAPI(t, r53)
	imds := &cloudfake.IMDS{InstanceID: instanceID, AZ: az, Hostname: "ip-169-255-0-15.eu-west-1.compute.internal",
		Role: "kiln-control-plane", Creds: roleCreds}
	imds.UserData = []byte(cloudNode("{awsTags: {k8s.io/role/master: \"1\"}}", "{provider: route53}",
		fmt.Sprintf("aws: {route53HostedZoneId: Z0KILNTEST0001, endpoints: {ec2: \"http://%[1]s:%[2]d\", route53: \"http://%[1]s:%[3]d\"}}", metadataIP, ec2Port, r53Port)))
	listenMetadata(t, imds)

	m, image, took := bootCloud(t, e, "aws", vm.Config{Root: vm.Disk{Bus: vm.BusNVMe, Name: "vol00000000000000001"},
		Extra: []string{"-qmp", "unix:" + sock + ",server=on,wait=off"}})
	t.Logf("EC2 boot: firstboot ok %s after QEMU started", took.Round(time.Second))
	logTimings(t, m.Lines())

	noRefusals(t, "IMDS", imds.Refused())
	if served := imds.Calls(); !slices.Contains(served, "GET /latest/user-data") ||
		!slices.Contains(served, "GET /latest/meta-data/iam/security-credentials/kiln-control-plane") {
		t.Errorf("IMDS served %q; want the user data and the role's credentials", served)
	}
	noRefusals(t, "EC2", ec2.Refused())
	ec2.Lock()
	for _, v := range ec2.Volumes {
		want := map[bool]string{true: "attached to " + instanceID, false: "available"}[v.ID == volID]
		got, err := v.State, error(nil)
		if len(v.Attachments) > 0 {
			a := v.Attachments[0]
			got, err = a.State+" to "+a.Instance, a.Err
		}
		if got != want || err != nil {
			t.Errorf("volume %s: %s (%v), want %s", v.ID, got, err, want)
		}
	}
	ec2.Unlock()
	noRefusals(t, "Route 53", r53.Refused())
	for _, name := range []string{"etcd-a.internal.demo.kiln.test.", "api.internal.demo.kiln.test."} {
		if got := strings.Join(r53.Records(name, "A"), " "); got != guestIP {
			t.Errorf("Route 53 %s A = %q, want %s", name, got, guestIP)
		}
	}
	if !consoleHas(m.Lines(), "etcd volume found", "etcd volume mounted") {
		t.Errorf("the console does not show the etcd volume found and mounted")
	}
	checkNode(t, e, image, etcdDisk, "ip-169-255-0-15", instanceID, az)
}

// testGCEBoot: the gce image on a "GCE" instance: disks on virtio-scsi as Google
// PersistentDisk, a metadata server that requires Metadata-Flavor, the etcd disk found by
// name and attached through Compute Engine (google-<device name>), the names in Cloud DNS.
func testGCEBoot(t *testing.T, e *env) {
	const project, zone, token = "kiln-test", "europe-west4-b", "ya29.kiln-test-token"
	etcdDisk := filepath.Join(e.dir, "pd-etcd-a.img")
	sparseDisk(t, etcdDisk, 2<<30)
	sock := filepath.Join(e.dir, "gce-qmp.sock")
	comp := &cloudfake.Compute{Token: token, Project: project, Zone: zone, Instances: []string{"cp-a", "cp-b"}, Disks: map[string]*cloudfake.GCEDisk{
		"demo-etcd-a": {SizeGB: 2},
		"demo-etcd-b": {SizeGB: 2, Users: []string{"cp-b"}, Devices: map[string]string{"cp-b": "demo-etcd-b"}},
	}}
	plug := hotplug(t, sock, etcdDisk, map[string]any{"driver": "scsi-hd", "bus": "scsi0.0", "vendor": "Google",
		"product": "PersistentDisk", "serial": "demo-etcd-a"})
	comp.Attach = func(string, string) error { return plug() }
	cdns := &cloudfake.CloudDNS{Token: token, Project: project, ZoneName: "kiln-test", DNSName: "kiln.test."}
	compPort, dnsPort := listenAPI(t, comp), listenAPI(t, cdns)
	md := &cloudfake.GCEMetadata{Project: project, Zone: zone, Name: "cp-a", ID: "4520031799277581759",
		Hostname: "cp-a.europe-west4-b.c.kiln-test.internal", Token: token, ServiceAccount: "cp@kiln-test.iam.gserviceaccount.com"}
	md.Attributes = map[string]string{"user-data": cloudNode("{gceName: demo-etcd-a}", "{provider: clouddns}",
		fmt.Sprintf("gce: {endpoints: {compute: \"http://%[1]s:%[2]d/compute/v1/\", dns: \"http://%[1]s:%[3]d/\"}}", metadataIP, compPort, dnsPort))}
	listenMetadata(t, md)

	m, image, took := bootCloud(t, e, "gce", vm.Config{
		Root:  vm.Disk{Bus: vm.BusSCSI, Name: "persistent-disk-0", Vendor: "Google", Product: "PersistentDisk"},
		Extra: []string{"-qmp", "unix:" + sock + ",server=on,wait=off"}})
	t.Logf("GCE boot: firstboot ok %s after QEMU started", took.Round(time.Second))
	logTimings(t, m.Lines())

	noRefusals(t, "metadata server", md.Refused())
	if served := md.Calls(); !slices.Contains(served, "GET /computeMetadata/v1/instance/attributes/user-data") ||
		!slices.Contains(served, "GET /computeMetadata/v1/instance/service-accounts/default/token") {
		t.Errorf("metadata served %q; want the user data and the service account's token", served)
	}
	noRefusals(t, "Compute", comp.Refused())
	comp.Lock()
	if d := comp.Disks["demo-etcd-a"]; !slices.Equal(d.Users, []string{"cp-a"}) || d.Devices["cp-a"] != "demo-etcd-a" {
		t.Errorf("disk demo-etcd-a: users %q devices %v, want attached to cp-a as demo-etcd-a", d.Users, d.Devices)
	}
	comp.Unlock()
	noRefusals(t, "Cloud DNS", cdns.Refused())
	for _, name := range []string{"etcd-a.internal.demo.kiln.test.", "api.internal.demo.kiln.test."} {
		if got := strings.Join(cdns.Records(name, "A"), " "); got != guestIP {
			t.Errorf("Cloud DNS %s A = %q, want %s", name, got, guestIP)
		}
	}
	if !consoleHas(m.Lines(), "etcd volume found", "etcd volume mounted") {
		t.Errorf("the console does not show the etcd volume found and mounted")
	}
	checkNode(t, e, image, etcdDisk, "cp-a", "4520031799277581759", zone)
}
