package qemucluster

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/kilnproject/kiln/internal/nodeimage"
)

// UpdateOptions is what `kiln cluster update` is asked for.
type UpdateOptions struct {
	// ImageDir holds the new images: <Image>-<role>.json and its pxe directory, as kiln bake
	// writes them. It must not be the directory the cluster's disks are overlays on.
	ImageDir string
	Image    string // image stem, default "qemu"
	// Identity is the ssh private key that logs in as root; "" lets ssh choose (its agent,
	// ~/.ssh/id_*).
	Identity       string
	AllowDowngrade bool
	// Timeout bounds each node's update: the write, the power cycle, Ready, the blessing.
	Timeout time.Duration
}

// guestUpdatePort is the node's loopback port on which the ssh session forwards the host's
// file server: the nodes' user network reaches nothing on the host (restrict=on).
const guestUpdatePort = 47080

// nodeUpdate is one node's update: its image's metadata and where the files are.
type nodeUpdate struct {
	node *Node
	json string // <ImageDir>/<Image>-<role>.json
	md   *nodeimage.Metadata
}

// files are the metadata's name and its pxe files, relative to the image directory, as the
// node asks for them.
func (u nodeUpdate) files() []string {
	p := u.md.PXE
	return []string{filepath.Base(u.json), p.Dir + "/" + p.Kernel.File, p.Dir + "/" + p.Initrd.File, p.Dir + "/" + p.RootFS.File}
}

// UpdateOrder is the order nodes are updated in: the etcd nodes, then the control planes,
// then the workers, each in the cluster's order; names limits it to those nodes (an unknown
// name is an error), none means every node.
func (s *State) UpdateOrder(names []string) ([]string, error) {
	for _, n := range names {
		if _, err := s.Node(n); err != nil {
			return nil, err
		}
	}
	var order []string
	for _, role := range []string{RoleEtcd, RoleControlPlane, RoleWorker} {
		for _, n := range s.Nodes {
			if n.Role == role && (len(names) == 0 || slices.Contains(names, n.Name)) && !slices.Contains(order, n.Name) {
				order = append(order, n.Name)
			}
		}
	}
	return order, nil
}

// planUpdate checks, before any node is touched, that each node can be reached over ssh and
// that its role's image is in the image directory with what an update reads.
func (s *State) planUpdate(order []string, o UpdateOptions) ([]nodeUpdate, error) {
	if o.ImageDir == "" {
		return nil, errors.New("no image directory: name the one holding the new images with --image-dir")
	}
	dir, err := filepath.Abs(o.ImageDir)
	if err != nil {
		return nil, err
	}
	for role, img := range map[string]string{RoleControlPlane: s.Images.ControlPlane, RoleWorker: s.Images.Worker, RoleEtcd: s.Images.Etcd} {
		if img != "" && filepath.Dir(img) == dir {
			return nil, fmt.Errorf("--image-dir %s holds the %s image the cluster's disks are overlays on (%s): bake the new images into another directory", o.ImageDir, role, img)
		}
	}
	var plan []nodeUpdate
	for _, name := range order {
		n, _ := s.Node(name)
		if n.SSHPort == 0 {
			return nil, fmt.Errorf("node %s has no ssh server: kiln cluster update logs in over ssh, so the cluster must be made with kiln cluster up --ssh-key", name)
		}
		u := nodeUpdate{node: n, json: filepath.Join(dir, o.Image+"-"+n.Role+".json")}
		b, err := os.ReadFile(u.json)
		if err != nil {
			return nil, fmt.Errorf("node %s: %w (bake the %s image: kiln bake images/%s.yaml --role %s -o %s)", name, err, n.Role, o.Image, n.Role, o.ImageDir)
		}
		if err := json.Unmarshal(b, &u.md); err != nil {
			return nil, fmt.Errorf("%s: %w", u.json, err)
		}
		if u.md.PXE == nil || u.md.Verity == nil {
			return nil, fmt.Errorf("%s: baked without the pxe format or without a verity tree: an update reads the pxe directory's kernel, initramfs and root image (add pxe to the definition's formats)", u.json)
		}
		for _, f := range u.files()[1:] {
			if _, err := os.Stat(filepath.Join(dir, filepath.FromSlash(f))); err != nil {
				return nil, fmt.Errorf("%s: %w", u.json, err)
			}
		}
		if s.Running(name) == 0 {
			return nil, fmt.Errorf("node %s is not running (kiln cluster start %s --name %s)", name, name, s.Name)
		}
		plan = append(plan, u)
	}
	return plan, nil
}

// Update moves the nodes in names (every node when none) to the images in o.ImageDir, one at
// a time in UpdateOrder: through an ssh session that forwards a file server on the host to
// the node, kiln-init update writes the node's other root slot; the node is powered off and
// booted again (a cold boot, as kiln cluster start: under TCG a warm reset of OVMF can hang
// QEMU), and the next node waits until this one is Ready, its new slot blessed and, on a
// node with an etcd member, that member is the same one and votes. A node that rolls back
// ends the update with the reason its kiln-init recorded.
func (s *State) Update(ctx context.Context, names []string, o UpdateOptions, progress Progress) error {
	o.Image = or(o.Image, "qemu")
	if o.Timeout == 0 {
		o.Timeout = 30 * time.Minute
	}
	order, err := s.UpdateOrder(names)
	if err != nil {
		return err
	}
	plan, err := s.planUpdate(order, o)
	if err != nil {
		return err
	}
	for _, u := range plan {
		if err := s.updateNode(ctx, u, o, progress); err != nil {
			return fmt.Errorf("node %s: %w", u.node.Name, err)
		}
	}
	return nil
}

func (s *State) updateNode(ctx context.Context, u nodeUpdate, o UpdateOptions, progress Progress) error {
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	n := u.node
	var member *EtcdMember
	if n.EtcdMember != "" {
		m, _, err := s.nodeMember(ctx, n)
		if err != nil {
			return fmt.Errorf("before the update: %w", err)
		}
		member = m
	}

	progress(n.Name, "writing "+filepath.Base(u.json)+" to its other slot")
	start := time.Now()
	if err := s.writeSlot(ctx, u, o); err != nil {
		return err
	}
	progress(n.Name, fmt.Sprintf("written in %s; powering off", time.Since(start).Round(time.Second)))
	if err := s.powerCycle(ctx, n, o); err != nil {
		return err
	}
	start = time.Now()
	progress(n.Name, "started")
	if err := s.wait(ctx, []string{n.Name}, untilReady, progress); err != nil {
		return err
	}
	slot, err := s.waitBlessed(ctx, u, o)
	if err != nil {
		return err
	}
	progress(n.Name, fmt.Sprintf("runs %s from slot %s (blessed %s after the power-on)", filepath.Base(u.json), slot, time.Since(start).Round(time.Second)))
	if member != nil {
		if err := s.waitMemberKept(ctx, n, *member); err != nil {
			return err
		}
		progress(n.Name, fmt.Sprintf("etcd member %s (%s) kept, voting", member.Name, member.ID))
	}
	return nil
}

// sshArgs are ssh's arguments to run command as root on node n.
func (s *State) sshArgs(n *Node, o UpdateOptions, extra ...string) []string {
	args := append(n.sshLogin(), "-o", "BatchMode=yes", "-o", "LogLevel=ERROR", "-o", "ConnectTimeout=20",
		"-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=4")
	if o.Identity != "" {
		args = append(args, "-i", o.Identity, "-o", "IdentitiesOnly=yes")
	}
	return append(append(args, extra...), "root@127.0.0.1")
}

// ssh runs command on node n and returns its output (stdout and stderr).
func (s *State) ssh(ctx context.Context, n *Node, o UpdateOptions, command string, extra ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, "ssh", append(s.sshArgs(n, o, extra...), command)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if err != nil {
		return out.Bytes(), fmt.Errorf("ssh %s: %s: %w: %s", n.Name, command, err, strings.TrimSpace(lastLines(out.String(), 15)))
	}
	return out.Bytes(), nil
}

// writeSlot serves the update's files on the host's loopback, forwards them to the node's and
// runs kiln-init update there.
func (s *State) writeSlot(ctx context.Context, u nodeUpdate, o UpdateOptions) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: serveFiles(filepath.Dir(u.json), u.files()), ReadHeaderTimeout: 30 * time.Second}
	go srv.Serve(ln)
	defer srv.Close()
	from := fmt.Sprintf("http://127.0.0.1:%d/%s", guestUpdatePort, filepath.Base(u.json))
	command := "kiln-init update --from " + from
	if o.AllowDowngrade {
		command += " --allow-downgrade"
	}
	_, err = s.ssh(ctx, u.node, o, command, "-o", "ExitOnForwardFailure=yes",
		"-R", fmt.Sprintf("127.0.0.1:%d:%s", guestUpdatePort, ln.Addr()))
	return err
}

// serveFiles serves exactly files (slash-separated, relative to dir) and nothing else.
func serveFiles(dir string, files []string) http.Handler {
	mux := http.NewServeMux()
	for _, f := range files {
		p := filepath.Join(dir, filepath.FromSlash(f))
		mux.HandleFunc("GET /"+f, func(w http.ResponseWriter, r *http.Request) { http.ServeFile(w, r, p) })
	}
	return mux
}

// powerCycle powers node off from inside (its disks synced), waits for its QEMU to end
// (SIGTERM after two minutes, as kiln cluster stop) and boots it again.
func (s *State) powerCycle(ctx context.Context, n *Node, o UpdateOptions) error {
	name := n.Name
	// The session ends with the machine: its error says nothing.
	s.ssh(ctx, n, o, "systemctl poweroff")
	deadline := time.Now().Add(2 * time.Minute)
	for s.Running(name) != 0 && time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
	if err := s.StopNode(name, 30*time.Second); err != nil {
		return err
	}
	return s.StartNode(ctx, name)
}

// slotStatus is what the host reads of `kiln-init update status -o json`.
type slotStatus struct {
	Slots []struct {
		Letter string
		Booted bool
	}
	Last *struct {
		Slot, RootHash, LastFailure string
		Blessed                     time.Time
		RolledBack                  *struct{ To, Reason string }
	}
}

// waitBlessed waits until the node booted the slot the update wrote and found it good, and
// returns the slot; a rollback is an error with its reason.
func (s *State) waitBlessed(ctx context.Context, u nodeUpdate, o UpdateOptions) (string, error) {
	var last string
	for {
		out, err := s.ssh(ctx, u.node, o, "kiln-init update status -o json")
		var st slotStatus
		switch {
		case err != nil:
			last = err.Error()
		case json.Unmarshal(out, &st) != nil || st.Last == nil:
			last = "kiln-init update status: " + strings.TrimSpace(string(out))
		case st.Last.RootHash != u.md.Verity.RootHash:
			return "", fmt.Errorf("the node's last update is root hash %s, not %s's %s", st.Last.RootHash, filepath.Base(u.json), u.md.Verity.RootHash)
		case st.Last.RolledBack != nil:
			return "", fmt.Errorf("rolled back to slot %s: %s (kiln cluster status shows its console; kiln-init update status on the node)", st.Last.RolledBack.To, st.Last.RolledBack.Reason)
		case !st.Last.Blessed.IsZero() && booted(st) == st.Last.Slot:
			return st.Last.Slot, nil
		default:
			last = fmt.Sprintf("slot %s not blessed yet (booted %s)", st.Last.Slot, booted(st))
			if st.Last.LastFailure != "" {
				last += ", last failed try: " + st.Last.LastFailure
			}
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("the new slot was not blessed in time: %s", last)
		case <-time.After(5 * time.Second):
		}
	}
}

func booted(st slotStatus) string {
	for _, s := range st.Slots {
		if s.Booted {
			return s.Letter
		}
	}
	return "?"
}

// nodeMember asks the cluster for node n's etcd member and returns it with the state it read.
func (s *State) nodeMember(ctx context.Context, n *Node) (*EtcdMember, *EtcdState, error) {
	es := s.Etcd(ctx)
	if es == nil {
		return nil, nil, errors.New("no etcd member answers")
	}
	if es.Error != "" {
		return nil, es, fmt.Errorf("etcd membership: %s", es.Error)
	}
	for _, m := range es.Members {
		if m.Name == n.Name || m.Name == n.EtcdMember {
			if m.Learner || !m.Started {
				return nil, es, fmt.Errorf("etcd member %s (%s) is not a started voting member", m.Name, m.ID)
			}
			return &m, es, nil
		}
	}
	return nil, es, fmt.Errorf("no etcd member of node %s among %d", n.Name, len(es.Members))
}

// waitMemberKept waits until node n's etcd member is what it was: the same ID, started,
// voting, and its own status a leader's or follower's.
func (s *State) waitMemberKept(ctx context.Context, n *Node, was EtcdMember) error {
	var last string
	for {
		m, es, err := s.nodeMember(ctx, n)
		switch {
		case err != nil:
			last = err.Error()
		case m.ID != was.ID:
			return fmt.Errorf("etcd member %s is %s now, was %s: the node did not keep its member", m.Name, m.ID, was.ID)
		case es.Nodes[n.Name] == "leader" || es.Nodes[n.Name] == "follower":
			return nil
		default:
			last = "its member says " + es.Nodes[n.Name]
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("etcd member %s (%s) not voting again in time: %s", was.Name, was.ID, last)
		case <-time.After(5 * time.Second):
		}
	}
}
