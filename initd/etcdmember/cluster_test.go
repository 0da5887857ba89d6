package etcdmember

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kilnproject/kiln/internal/testkit"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// testCluster is three etcd processes a, b and c on 127.0.<net>.1-3 (client port 2379,
// peer port 2380; each cluster its own net, so that tests run in parallel), run from the
// etcd binary the profiles pin (built by build-components.sh etcd), each with its own data
// directory: the same etcd the nodes run, driven by the same code.
type testCluster struct {
	t       *testing.T
	net     int
	bin     string
	pki     testPKI
	members []Member
	dirs    map[string]string

	mu      sync.Mutex
	running map[string]*etcdProc
	waits   map[string][]string // the WaitError reasons each member's boot saw
}

// etcdProc is one running etcd.
type etcdProc struct {
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan struct{}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// nextNet is the third octet of the next test cluster's loopback addresses.
var nextNet atomic.Int32

func newTestCluster(t *testing.T) *testCluster {
	t.Parallel()
	n := 20 + int(nextNet.Add(1))
	c := &testCluster{t: t, net: n, bin: testkit.Component(t, "etcd", "etcd"), dirs: map[string]string{},
		running: map[string]*etcdProc{}, waits: map[string][]string{}}
	c.pki = newTestPKI(t, c.ip(1), c.ip(2), c.ip(3))
	for i, name := range []string{"a", "b", "c"} {
		c.members = append(c.members, Member{Name: name, PeerURL: "https://" + c.ip(i+1) + ":2380"})
		// A formatted disk's mount point: lost+found is there before etcd's member directory.
		c.dirs[name] = filepath.Join(t.TempDir(), "etcd")
		if err := os.MkdirAll(filepath.Join(c.dirs[name], "lost+found"), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, name := range []string{"a", "b", "c"} {
			c.kill(name)
		}
	})
	return c
}

// ip is the address of the cluster's i-th member (1-3).
func (c *testCluster) ip(i int) string { return fmt.Sprintf("127.0.%d.%d", c.net, i) }

func (c *testCluster) member(name string) Member {
	for _, m := range c.members {
		if m.Name == name {
			return m
		}
	}
	c.t.Fatalf("no member %s", name)
	return Member{}
}

func (c *testCluster) clientURL(name string) string {
	ep, _ := ClientURL(c.member(name).PeerURL)
	return ep
}

// start starts member name's etcd with plan's state and cluster, as the node's etcd
// manifest does; it does not wait for it to serve.
func (c *testCluster) start(name string, p Plan) {
	c.t.Helper()
	var initial []string
	for _, m := range p.Members {
		initial = append(initial, m.Name+"="+m.PeerURL)
	}
	peer, client := c.member(name).PeerURL, c.clientURL(name)
	args := []string{"--name=" + name, "--data-dir=" + c.dirs[name],
		"--listen-peer-urls=" + peer, "--initial-advertise-peer-urls=" + peer,
		"--listen-client-urls=" + client, "--advertise-client-urls=" + client,
		"--initial-cluster=" + strings.Join(initial, ","), "--initial-cluster-state=" + p.State,
		"--initial-cluster-token=kiln-test", "--log-level=warn",
		"--cert-file=" + c.pki.crt, "--key-file=" + c.pki.key, "--trusted-ca-file=" + c.pki.ca, "--client-cert-auth",
		"--peer-cert-file=" + c.pki.crt, "--peer-key-file=" + c.pki.key, "--peer-trusted-ca-file=" + c.pki.ca,
		"--peer-client-cert-auth"}
	cmd := exec.Command(c.bin, args...)
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		c.t.Fatalf("start etcd %s: %v", name, err)
	}
	proc := &etcdProc{cmd: cmd, out: out, done: make(chan struct{})}
	go func() { cmd.Wait(); close(proc.done) }()
	c.mu.Lock()
	c.running[name] = proc
	c.mu.Unlock()
}

// kill cuts member name's power: SIGKILL, no clean shutdown.
func (c *testCluster) kill(name string) {
	c.mu.Lock()
	p := c.running[name]
	delete(c.running, name)
	c.mu.Unlock()
	if p == nil {
		return
	}
	p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// wipe gives member name a blank disk: a new machine in its place.
func (c *testCluster) wipe(name string) {
	c.t.Helper()
	if err := os.RemoveAll(c.dirs[name]); err != nil {
		c.t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(c.dirs[name], "lost+found"), 0o700); err != nil {
		c.t.Fatal(err)
	}
}

// output is member name's etcd log so far (for failures).
func (c *testCluster) output(name string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if p := c.running[name]; p != nil {
		return p.out.String()
	}
	return "(not running)"
}

func (c *testCluster) opts(name string) Options {
	m := c.member(name)
	return Options{Name: name, PeerURL: m.PeerURL, DataDir: c.dirs[name], Members: c.members, TLS: c.pki.client,
		Timeout: 3 * time.Second}
}

// boot is what a node does for its member: first boot decides (waiting, and asking again,
// while Decide says to wait), etcd starts with the plan, and the promotion service promotes
// a learner. It returns the plan the member started with.
func (c *testCluster) boot(ctx context.Context, name string) (Plan, error) {
	var p Plan
	for {
		var err error
		p, err = Decide(ctx, c.opts(name))
		var w *WaitError
		if errors.As(err, &w) {
			c.mu.Lock()
			c.waits[name] = append(c.waits[name], w.Reason)
			c.mu.Unlock()
			select {
			case <-ctx.Done():
				return p, fmt.Errorf("%s: %w (last: %v)", name, ctx.Err(), err)
			case <-time.After(200 * time.Millisecond):
			}
			continue
		}
		if err != nil {
			return p, fmt.Errorf("%s: %w", name, err)
		}
		break
	}
	c.start(name, p)
	if p.Learner {
		if _, err := Promote(ctx, c.opts(name), 200*time.Millisecond); err != nil {
			return p, fmt.Errorf("%s: %w\netcd log:\n%s", name, err, c.output(name))
		}
	}
	return p, nil
}

// bootAll boots names at once, as machines of an autoscaling group do, and returns their
// plans.
func (c *testCluster) bootAll(names ...string) map[string]Plan {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	plans := map[string]Plan{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make([]error, len(names))
	for i, n := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p, err := c.boot(ctx, n)
			mu.Lock()
			plans[n], errs[i] = p, err
			mu.Unlock()
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, n := range []string{"a", "b", "c"} {
			c.t.Logf("etcd %s:\n%s", n, c.output(n))
		}
		c.t.Fatal(err)
	}
	return plans
}

func (c *testCluster) client(name string) *clientv3.Client {
	c.t.Helper()
	cl, err := clientv3.New(clientv3.Config{Endpoints: []string{c.clientURL(name)}, TLS: c.pki.client,
		DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { cl.Close() })
	return cl
}

// voters waits until the membership, asked of member from, lists want as started voting
// members and nothing else, and fails the test with the list otherwise.
func (c *testCluster) voters(from string, want ...string) {
	c.t.Helper()
	cl := c.client(from)
	var got string
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		r, err := cl.MemberList(ctx)
		cancel()
		if err != nil {
			got = err.Error()
		} else {
			var names []string
			for _, m := range r.Members {
				switch {
				case m.Name == "":
					names = append(names, "(not started)")
				case m.IsLearner:
					names = append(names, m.Name+" (learner)")
				default:
					names = append(names, m.Name)
				}
			}
			slices.Sort(names)
			if slices.Equal(names, want) {
				return
			}
			got = strings.Join(names, ", ")
		}
		time.Sleep(200 * time.Millisecond)
	}
	c.t.Fatalf("members seen from %s: %s; want voting members %v", from, got, want)
}

// put writes key through member name (bounded), and get reads it back from another.
func (c *testCluster) put(name, key, value string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := c.client(name).Put(ctx, key, value)
	return err
}

// get reads key through member name, retrying for a while (a member that just started
// may not have applied it yet); "" when it never answers with a value.
func (c *testCluster) get(name, key string) string {
	c.t.Helper()
	cl := c.client(name)
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		r, err := cl.Get(ctx, key)
		cancel()
		if err == nil && len(r.Kvs) == 1 {
			return string(r.Kvs[0].Value)
		}
		time.Sleep(200 * time.Millisecond)
	}
	return ""
}
