package qemucluster

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/kilnproject/kiln/builder/cluster"
	"github.com/kilnproject/kiln/initd/pki"
)

// etcdClientName is the client certificate the host asks the etcd members with, issued by
// the cluster's etcd CA into the state directory (etcd-client.crt, .key).
const etcdClientName = "etcd-client"

// writeEtcdClient issues the host's etcd client certificate from cluster init's etcd CA.
func (s *State) writeEtcdClient(now time.Time) error {
	ca, err := pki.LoadCA(filepath.Join(s.initDir(), cluster.PKIDir), pki.EtcdCAName)
	if err != nil {
		return err
	}
	kp, err := ca.Issue(pki.Cert{CommonName: "kiln-cluster-" + s.Name, Client: true}, now)
	if err != nil {
		return err
	}
	return pki.WriteKeyPair(s.Dir, etcdClientName, kp)
}

// EtcdTLS is the TLS configuration the host asks the members with (the state directory's
// client certificate and the etcd CA); EtcdClientFiles names its files, for etcdctl.
func (s *State) EtcdTLS() (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(s.file(etcdClientName+".crt"), s.file(etcdClientName+".key"))
	if err != nil {
		return nil, fmt.Errorf("etcd client certificate: %w", err)
	}
	ca, err := pki.LoadCA(filepath.Join(s.initDir(), cluster.PKIDir), pki.EtcdCAName)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	return &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool, MinVersion: tls.VersionTLS12}, nil
}

// EtcdClientFiles are the CA, certificate and key files etcdctl takes (--cacert, --cert, --key).
func (s *State) EtcdClientFiles() (ca, cert, key string) {
	return filepath.Join(s.initDir(), cluster.PKIDir, pki.EtcdCAName+".crt"), s.file(etcdClientName + ".crt"), s.file(etcdClientName + ".key")
}

// EtcdEndpoint is the host's client URL of node's etcd member (its forwarded port), "" for a
// node without one.
func (n Node) EtcdEndpoint() string {
	if n.EtcdPort == 0 {
		return ""
	}
	return "https://127.0.0.1:" + strconv.Itoa(n.EtcdPort)
}

// EtcdMember is one member as the cluster lists it.
type EtcdMember struct {
	Name    string `json:"name"` // "" while never started
	ID      string `json:"id"`
	Started bool   `json:"started"`
	Learner bool   `json:"learner"`
	Leader  bool   `json:"leader"`
}

// EtcdState is the etcd cluster as its members tell it: the membership (from a voting member
// that answers) and, per node, what its own member says of itself.
type EtcdState struct {
	Members []EtcdMember `json:"members"`
	// Error says why no member answered for the membership.
	Error string `json:"error,omitempty"`
	// Nodes is each running member's own status, by node name: "leader", "follower",
	// "learner", or why it did not answer.
	Nodes map[string]string `json:"nodes"`
	// Slow are etcd's own counts of each running member's slow applies and read indexes and
	// leader changes, from its /metrics, by node name.
	Slow map[string]EtcdSlow `json:"slow,omitempty"`
}

// EtcdSlow are a member's counters of trouble since it started.
type EtcdSlow struct {
	SlowApplies      int `json:"slowApplies"`
	SlowReadIndexes  int `json:"slowReadIndexes"`
	LeaderChanges    int `json:"leaderChanges"`
	HeartbeatFailure int `json:"heartbeatFailures"`
}

// Etcd asks every running member (through its forwarded client port) for its status, the
// membership and its trouble counters; nil for a cluster without forwarded members.
func (s *State) Etcd(ctx context.Context) *EtcdState {
	var nodes []Node
	for _, n := range s.Nodes {
		if n.EtcdPort != 0 && s.Running(n.Name) != 0 {
			nodes = append(nodes, n)
		}
	}
	hasMembers := slices.ContainsFunc(s.Nodes, func(n Node) bool { return n.EtcdPort != 0 })
	if !hasMembers {
		return nil
	}
	st := &EtcdState{Nodes: map[string]string{}, Slow: map[string]EtcdSlow{}}
	tc, err := s.EtcdTLS()
	if err != nil {
		st.Error = err.Error()
		return st
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	var leader uint64
	for _, n := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			self, lead, slow, err := memberStatus(ctx, n.EtcdEndpoint(), tc)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				st.Nodes[n.Name] = err.Error()
			case self.learner:
				st.Nodes[n.Name] = "learner"
			case lead == self.id:
				st.Nodes[n.Name] = "leader"
			default:
				st.Nodes[n.Name] = "follower"
			}
			if err == nil {
				leader = lead
				st.Slow[n.Name] = slow
			}
		}()
	}
	wg.Wait()
	var eps []string
	for _, n := range nodes {
		if r := st.Nodes[n.Name]; r == "leader" || r == "follower" {
			eps = append(eps, n.EtcdEndpoint())
		}
	}
	if len(eps) == 0 {
		st.Error = "no voting member answers"
		return st
	}
	c, err := clientv3.New(clientv3.Config{Endpoints: eps, TLS: tc, DialTimeout: 10 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		st.Error = err.Error()
		return st
	}
	defer c.Close()
	lctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	r, err := c.MemberList(lctx)
	if err != nil {
		st.Error = err.Error()
		return st
	}
	for _, m := range r.Members {
		st.Members = append(st.Members, EtcdMember{Name: m.Name, ID: fmt.Sprintf("%x", m.ID), Started: m.Name != "",
			Learner: m.IsLearner, Leader: m.ID == leader})
	}
	slices.SortFunc(st.Members, func(a, b EtcdMember) int { return strings.Compare(a.Name, b.Name) })
	return st
}

type selfStatus struct {
	id      uint64
	learner bool
}

// memberStatus asks the member at endpoint for its status (itself, its leader) and its
// trouble counters.
func memberStatus(ctx context.Context, endpoint string, tc *tls.Config) (selfStatus, uint64, EtcdSlow, error) {
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, TLS: tc, DialTimeout: 10 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return selfStatus{}, 0, EtcdSlow{}, err
	}
	defer c.Close()
	sctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	r, err := c.Status(sctx, endpoint)
	if err != nil {
		return selfStatus{}, 0, EtcdSlow{}, err
	}
	slow, err := memberMetrics(sctx, endpoint, tc)
	return selfStatus{id: r.Header.MemberId, learner: r.IsLearner}, r.Leader, slow, err
}

// memberMetrics reads the trouble counters from the member's /metrics (the client port
// serves it, with the same client certificate).
func memberMetrics(ctx context.Context, endpoint string, tc *tls.Config) (EtcdSlow, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, endpoint+"/metrics", nil)
	if err != nil {
		return EtcdSlow{}, err
	}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: tc}}
	resp, err := hc.Do(req)
	if err != nil {
		return EtcdSlow{}, fmt.Errorf("metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return EtcdSlow{}, fmt.Errorf("metrics: %s", resp.Status)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return EtcdSlow{}, fmt.Errorf("metrics: %w", err)
	}
	var m EtcdSlow
	for _, l := range strings.Split(string(body), "\n") {
		name, val, ok := strings.Cut(l, " ")
		if !ok || strings.HasPrefix(l, "#") {
			continue
		}
		f, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if err != nil {
			continue
		}
		switch name {
		case "etcd_server_slow_apply_total":
			m.SlowApplies = int(f)
		case "etcd_server_slow_read_indexes_total":
			m.SlowReadIndexes = int(f)
		case "etcd_server_leader_changes_seen_total":
			m.LeaderChanges = int(f)
		case "etcd_server_heartbeat_send_failures_total":
			m.HeartbeatFailure = int(f)
		}
	}
	return m, nil
}
