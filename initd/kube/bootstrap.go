package kube

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/kilnproject/kiln/initd/pki"
	"github.com/kilnproject/kiln/initd/task"
	"github.com/kilnproject/kiln/internal/atomicfile"
	"github.com/kilnproject/kiln/internal/kubeconfig"
	"github.com/kilnproject/kiln/internal/nodeimage"
	"github.com/kilnproject/kiln/internal/poll"
)

// Names kubeadm gives the things its init phases create; kiln uses the same so that
// kubeadm-aware tools (and people) find them.
const (
	// nodeBootstrapGroup is the group a bootstrap token authenticates into.
	nodeBootstrapGroup = "system:bootstrappers:kubeadm:default-node-token"
	// labelControlPlane and taintControlPlane mark a control-plane node.
	labelControlPlane = "node-role.kubernetes.io/control-plane"
	taintControlPlane = "node-role.kubernetes.io/control-plane"
	// labelExcludeLB keeps the node out of external load balancers, as kubeadm does.
	labelExcludeLB = "node.kubernetes.io/exclude-from-external-load-balancers"
	// tokenTTL is how long the bootstrap token is valid after the control plane created it.
	tokenTTL = 24 * time.Hour
)

// BootstrapOptions configure the control-plane bootstrap (BootstrapTasks).
type BootstrapOptions struct {
	// Root is the node's root; "" means "/".
	Root string
	// NodeName is this node's Node object.
	NodeName string
	// APIEndpoint is the cluster's API address as node.yaml gives it (host:port or
	// https://host:port): the server of the cluster-info kubeconfig joining nodes read.
	APIEndpoint string
	// APIWait bounds the wait for the API server's /readyz; 0 means 20 minutes (an
	// emulated guest needs minutes to start etcd and kube-apiserver).
	APIWait time.Duration
	// NodeWait bounds the wait for kubelet to register this node; 0 means 10 minutes.
	NodeWait time.Duration
	// PodCIDRs, when set, are the pod ranges this node takes at registration if it has none
	// (ReservedPodCIDRs): its node is Ready without waiting for kube-controller-manager.
	PodCIDRs []string
	// interval is the time between two tries of a step the API refused for now; 0 means
	// 2 seconds.
	interval time.Duration
	// Log receives progress; nil discards it.
	Log *slog.Logger
	// Waiting, when set, says what the API server waits for (an HA control plane: how many
	// etcd members answer); it is logged with each change while the API is not ready.
	Waiting func(context.Context) string
	// now is the clock (token expiry); nil means time.Now.
	now func() time.Time
}

func (o BootstrapOptions) withDefaults() BootstrapOptions {
	if o.Root == "" {
		o.Root = "/"
	}
	if o.APIWait == 0 {
		o.APIWait = 20 * time.Minute
	}
	if o.NodeWait == 0 {
		o.NodeWait = 10 * time.Minute
	}
	if o.interval == 0 {
		o.interval = 2 * time.Second
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.now == nil {
		o.now = time.Now
	}
	return o
}

// bootstrap is one run of the control-plane bootstrap.
type bootstrap struct {
	o     BootstrapOptions
	admin *Client
}

// BootstrapTasks are kubeadm's init phases that need a running API server, as idempotent
// tasks (each checks before it writes, so a second run changes nothing):
//
//	api-ready ─► cluster-admins ─┬─► bootstrap-token   (Secret kube-system/bootstrap-token-<id>, 24 h)
//	                             ├─► bootstrap-rbac    (TLS bootstrap + CSR auto-approval bindings)
//	                             ├─► cluster-info      (kube-public ConfigMap, readable anonymously)
//	                             ├─► mark-control-plane (label + NoSchedule taint, once kubelet registered)
//	                             └─► addon-<file>      (one per manifest in nodeimage.AddonsDir: kube-proxy, coredns)
//	api-ready ─► kubelet-finalize (kubelet.conf points at kubelet's rotated client certificate)
//	pod-cidr                       (with PodCIDRs: the node's pod ranges, once kubelet registered)
//
// cluster-admins binds kubeadm:cluster-admins (admin.conf's group) to cluster-admin with
// super-admin.conf; every later step uses admin.conf.
func BootstrapTasks(o BootstrapOptions) ([]task.Task, error) {
	o = o.withDefaults()
	if o.NodeName == "" {
		return nil, errors.New("control-plane bootstrap: no node name")
	}
	b := &bootstrap{o: o}
	after := []string{"cluster-admins"}
	tasks := []task.Task{
		b.apiReadyTask(),
		task.Converge("cluster-admins", []string{"api-ready"}, b.clusterAdmins),
		task.Converge("bootstrap-token", after, b.bootstrapToken),
		task.Converge("bootstrap-rbac", after, b.applyAll(bootstrapRBAC)),
		task.Converge("cluster-info", after, b.clusterInfo),
		ConvergeWithTimeout("mark-control-plane", after, o.NodeWait+time.Minute, b.markControlPlane),
		task.Converge("kubelet-finalize", []string{"api-ready"}, b.kubeletFinalize),
	}
	if len(o.PodCIDRs) > 0 {
		// Not after api-ready: the API serves nodes to super-admin.conf before /readyz.
		tasks = append(tasks, ConvergeWithTimeout("pod-cidr", nil, o.APIWait+o.NodeWait+time.Minute, b.podCIDR))
	}
	addons, err := addonFiles(filepath.Join(o.Root, nodeimage.AddonsDir))
	if err != nil {
		return nil, err
	}
	for _, f := range addons {
		name := "addon-" + strings.TrimSuffix(filepath.Base(f), filepath.Ext(f))
		tasks = append(tasks, task.Converge(name, after, b.applyFile(f)))
	}
	return tasks, nil
}

// APIReadyTask is the "api-ready" task alone: it waits (bounded by o.APIWait) until the API
// server of admin.conf answers /readyz, as the bootstrap does before its first step. Work
// that is useful only once the API serves orders itself after it.
func APIReadyTask(o BootstrapOptions) task.Task {
	b := &bootstrap{o: o.withDefaults()}
	return b.apiReadyTask()
}

func (b *bootstrap) apiReadyTask() task.Task {
	return task.WithTimeout(task.Func("api-ready", nil, b.apiReady, b.waitAPI), b.o.APIWait+time.Minute)
}

// addonFiles lists the .yaml manifests in dir, sorted; none when dir does not exist.
func addonFiles(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("addons: %w", err)
	}
	var out []string
	for _, e := range entries {
		if !e.IsDir() && (strings.HasSuffix(e.Name(), ".yaml") || strings.HasSuffix(e.Name(), ".yml")) {
			out = append(out, filepath.Join(dir, e.Name()))
		}
	}
	slices.Sort(out)
	return out, nil
}

// client is the admin.conf client, loaded once it is needed.
func (b *bootstrap) client() (*Client, error) {
	if b.admin == nil {
		c, err := LoadKubeconfig(b.o.Root, nodeimage.AdminConfPath)
		if err != nil {
			return nil, err
		}
		b.admin = c
	}
	return b.admin, nil
}

func (b *bootstrap) apiReady(ctx context.Context) (bool, error) {
	c, err := b.client()
	if err != nil {
		return false, err
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return c.ready(rctx) == nil, nil
}

func (b *bootstrap) waitAPI(ctx context.Context) error {
	c, err := b.client()
	if err != nil {
		return err
	}
	start := time.Now()
	last := ""
	err = waitUntil(ctx, b.o.APIWait, b.o.interval, "/readyz", func(ctx context.Context) (bool, error) {
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		err := c.ready(rctx)
		if err != nil {
			what := "API server " + c.server + "/readyz"
			if b.o.Waiting != nil {
				w := b.o.Waiting(ctx)
				what += "; " + w
				reportDetail(ctx, w)
			}
			note(b.o.Log, &last, what, err)
		}
		return err == nil, err
	})
	if err != nil {
		return fmt.Errorf("API server %s not ready: %w", c.server, err)
	}
	b.o.Log.Info("API server ready", "server", c.server, "waited", time.Since(start).Round(time.Second))
	return nil
}

// retry runs f until it succeeds, fails for good (an error that is not transient) or ctx
// ends: the API server may still be settling (e.g. RBAC caches) right after /readyz.
func (b *bootstrap) retry(ctx context.Context, f func(context.Context) (bool, error)) (bool, error) {
	var changed bool
	err := poll.Retry(ctx, poll.Options{
		What:      "the API server",
		Backoff:   poll.Constant(b.o.interval),
		Retryable: transient,
		OnRetry:   func(a poll.Attempt) { b.o.Log.Debug("retrying", "error", a.Err) },
	}, func(ctx context.Context) error {
		var err error
		changed, err = f(ctx)
		return err
	})
	if err != nil {
		return false, err
	}
	return changed, nil
}

// applyObjects server-side applies objs with c, in order.
func (b *bootstrap) applyObjects(ctx context.Context, c *Client, objs []object) (bool, error) {
	return b.retry(ctx, func(ctx context.Context) (bool, error) {
		some := false
		for _, o := range objs {
			changed, err := c.apply(ctx, o)
			if err != nil {
				return some, err
			}
			if changed {
				b.o.Log.Info("applied", "object", o.String())
			}
			some = some || changed
		}
		return some, nil
	})
}

func (b *bootstrap) applyAll(objs func() []object) func(context.Context) (bool, error) {
	return func(ctx context.Context) (bool, error) {
		c, err := b.client()
		if err != nil {
			return false, err
		}
		return b.applyObjects(ctx, c, objs())
	}
}

func (b *bootstrap) applyFile(path string) func(context.Context) (bool, error) {
	return func(ctx context.Context) (bool, error) {
		data, err := os.ReadFile(path)
		if err != nil {
			return false, fmt.Errorf("addon: %w", err)
		}
		objs, err := parseManifests(data, path)
		if err != nil {
			return false, err
		}
		c, err := b.client()
		if err != nil {
			return false, err
		}
		return b.applyObjects(ctx, c, objs)
	}
}

// clusterAdmins is kubeadm's first write: admin.conf's group gets cluster-admin. Only
// super-admin.conf (system:masters) may write it before it exists.
func (b *bootstrap) clusterAdmins(ctx context.Context) (bool, error) {
	c, err := LoadKubeconfig(b.o.Root, nodeimage.SuperAdminConfPath)
	if err != nil {
		return false, err
	}
	return b.applyObjects(ctx, c, []object{clusterRoleBinding("kubeadm:cluster-admins", "cluster-admin", group(pki.GroupClusterAdmins))})
}

// bootstrapToken creates the token Secret kubelets TLS-bootstrap with, from the token
// `kiln cluster init` delivered in nodeimage.BootstrapTokenPath. An existing Secret is kept as it
// is (its expiry is not extended); a node without a token file has nothing to do.
func (b *bootstrap) bootstrapToken(ctx context.Context) (bool, error) {
	data, err := os.ReadFile(filepath.Join(b.o.Root, nodeimage.BootstrapTokenPath))
	if errors.Is(err, fs.ErrNotExist) {
		b.o.Log.Info("no bootstrap token; workers cannot join with one", "path", nodeimage.BootstrapTokenPath)
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("bootstrap token: %w", err)
	}
	tok, err := pki.ParseToken(strings.TrimSpace(string(data)))
	if err != nil {
		return false, fmt.Errorf("bootstrap token %s: %w", nodeimage.BootstrapTokenPath, err)
	}
	c, err := b.client()
	if err != nil {
		return false, err
	}
	secret := tokenSecret(tok, b.o.now().Add(tokenTTL))
	return b.retry(ctx, func(ctx context.Context) (bool, error) { return c.create(ctx, secret) })
}

// tokenSecret is the bootstrap token Secret kubeadm's bootstrap-token phase writes:
// usable for authentication (kubelet's TLS bootstrap) and for signing cluster-info, in
// the group nodeBootstrapGroup, expiring at expires.
func tokenSecret(t pki.Token, expires time.Time) object {
	return object{
		"apiVersion": "v1",
		"kind":       "Secret",
		"metadata": map[string]any{
			"name":      "bootstrap-token-" + t.ID,
			"namespace": "kube-system",
		},
		"type": "bootstrap.kubernetes.io/token",
		"stringData": map[string]any{
			"description":                    "kiln: joins nodes to the cluster (written at the control plane's first boot)",
			"token-id":                       t.ID,
			"token-secret":                   t.Secret,
			"expiration":                     expires.UTC().Format(time.RFC3339),
			"usage-bootstrap-authentication": "true",
			"usage-bootstrap-signing":        "true",
			"auth-extra-groups":              nodeBootstrapGroup,
		},
	}
}

// bootstrapRBAC are kubeadm's bindings for joining nodes: bootstrap tokens may create
// CSRs and read nodes, their client CSRs are approved automatically, and so are the
// renewals of nodes' own client certificates.
func bootstrapRBAC() []object {
	return []object{
		clusterRoleBinding("kubeadm:kubelet-bootstrap", "system:node-bootstrapper", group(nodeBootstrapGroup)),
		clusterRoleBinding("kubeadm:node-autoapprove-bootstrap",
			"system:certificates.k8s.io:certificatesigningrequests:nodeclient", group(nodeBootstrapGroup)),
		clusterRoleBinding("kubeadm:node-autoapprove-certificate-rotation",
			"system:certificates.k8s.io:certificatesigningrequests:selfnodeclient", group("system:nodes")),
		{
			"apiVersion": "rbac.authorization.k8s.io/v1",
			"kind":       "ClusterRole",
			"metadata":   map[string]any{"name": "kubeadm:get-nodes"},
			"rules":      []any{map[string]any{"apiGroups": []any{""}, "resources": []any{"nodes"}, "verbs": []any{"get"}}},
		},
		clusterRoleBinding("kubeadm:get-nodes", "kubeadm:get-nodes", group(nodeBootstrapGroup)),
	}
}

func group(name string) map[string]any {
	return map[string]any{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": name}
}

func clusterRoleBinding(name, role string, subjects ...map[string]any) object {
	subs := make([]any, len(subjects))
	for i, s := range subjects {
		subs[i] = s
	}
	return object{
		"apiVersion": "rbac.authorization.k8s.io/v1",
		"kind":       "ClusterRoleBinding",
		"metadata":   map[string]any{"name": name},
		"roleRef":    map[string]any{"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
		"subjects":   subs,
	}
}

// clusterInfo publishes kube-public/cluster-info (the cluster's CA and API endpoint, as a
// kubeconfig without users) and lets anonymous users read it: joining nodes discover the
// cluster there, and the bootstrap signer signs it with each signing token.
func (b *bootstrap) clusterInfo(ctx context.Context) (bool, error) {
	ca, err := os.ReadFile(filepath.Join(b.o.Root, nodeimage.KubeCACertPath))
	if err != nil {
		return false, fmt.Errorf("cluster-info: %w", err)
	}
	if b.o.APIEndpoint == "" {
		return false, errors.New("cluster-info: no API endpoint")
	}
	objs, err := clusterInfo(pki.ServerURL(b.o.APIEndpoint), ca)
	if err != nil {
		return false, err
	}
	c, err := b.client()
	if err != nil {
		return false, err
	}
	return b.applyObjects(ctx, c, objs)
}

// clusterInfo is the kube-public/cluster-info ConfigMap for server and the CA, and the
// Role and RoleBinding that let system:anonymous get it.
func clusterInfo(server string, caPEM []byte) ([]object, error) {
	if _, err := pki.ParseCertPEM(caPEM); err != nil {
		return nil, fmt.Errorf("cluster-info: CA: %w", err)
	}
	kc := kubeconfig.New()
	kc.Clusters = []kubeconfig.NamedCluster{{Cluster: kubeconfig.Cluster{CAData: b64(caPEM), Server: server}}}
	data, err := kc.Encode()
	if err != nil {
		return nil, fmt.Errorf("cluster-info: %w", err)
	}
	const name = "kubeadm:bootstrap-signer-clusterinfo"
	return []object{
		{
			"apiVersion": "v1",
			"kind":       "ConfigMap",
			"metadata":   map[string]any{"name": "cluster-info", "namespace": "kube-public"},
			"data":       map[string]any{"kubeconfig": string(data)},
		},
		{
			"apiVersion": "rbac.authorization.k8s.io/v1",
			"kind":       "Role",
			"metadata":   map[string]any{"name": name, "namespace": "kube-public"},
			"rules": []any{map[string]any{"apiGroups": []any{""}, "resources": []any{"configmaps"},
				"resourceNames": []any{"cluster-info"}, "verbs": []any{"get"}}},
		},
		{
			"apiVersion": "rbac.authorization.k8s.io/v1",
			"kind":       "RoleBinding",
			"metadata":   map[string]any{"name": name, "namespace": "kube-public"},
			"roleRef":    map[string]any{"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
			"subjects":   []any{map[string]any{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "system:anonymous"}},
		},
	}, nil
}

// nodePath is the API path of the Node named name.
func nodePath(name string) string { return "/api/v1/nodes/" + url.PathEscape(name) }

// waitNode waits, up to limit, until c reads this node: kubelet registered it.
func (b *bootstrap) waitNode(ctx context.Context, c *Client, limit time.Duration) error {
	path := nodePath(b.o.NodeName)
	last := ""
	err := waitUntil(ctx, limit, b.o.interval, "kubelet to register it", func(ctx context.Context) (bool, error) {
		err := c.get(ctx, path, nil)
		if err != nil {
			note(b.o.Log, &last, "node "+b.o.NodeName+" to register", err)
		}
		return err == nil, err
	})
	if err != nil {
		return fmt.Errorf("node %s: %w", b.o.NodeName, err)
	}
	return nil
}

// markControlPlane waits (bounded) for kubelet to register the node, then labels it a
// control plane and taints it NoSchedule, keeping its other labels and taints. The
// NodeRestriction admission plugin forbids kubelet to set node-role labels itself.
func (b *bootstrap) markControlPlane(ctx context.Context) (bool, error) {
	c, err := b.client()
	if err != nil {
		return false, err
	}
	path := nodePath(b.o.NodeName)
	type taint map[string]any
	var node struct {
		Metadata struct {
			Labels          map[string]string `json:"labels"`
			ResourceVersion string            `json:"resourceVersion"`
		} `json:"metadata"`
		Spec struct {
			Taints []taint `json:"taints"`
		} `json:"spec"`
	}
	if err := b.waitNode(ctx, c, b.o.NodeWait); err != nil {
		return false, err
	}
	return b.retry(ctx, func(ctx context.Context) (bool, error) {
		if err := c.get(ctx, path, &node); err != nil {
			return false, err
		}
		hasTaint := slices.ContainsFunc(node.Spec.Taints, func(t taint) bool {
			return t["key"] == taintControlPlane && t["effect"] == "NoSchedule"
		})
		_, l1 := node.Metadata.Labels[labelControlPlane]
		_, l2 := node.Metadata.Labels[labelExcludeLB]
		if hasTaint && l1 && l2 {
			return false, nil
		}
		taints := node.Spec.Taints
		if !hasTaint {
			taints = append(taints, taint{"key": taintControlPlane, "effect": "NoSchedule"})
		}
		patch, err := json.Marshal(map[string]any{
			"metadata": map[string]any{
				"labels":          map[string]string{labelControlPlane: "", labelExcludeLB: ""},
				"resourceVersion": node.Metadata.ResourceVersion, // a concurrent change is a conflict: retried
			},
			"spec": map[string]any{"taints": taints},
		})
		if err != nil {
			return false, err
		}
		if err := c.do(ctx, http.MethodPatch, path, contentMergePatch, patch, nil); err != nil {
			return false, fmt.Errorf("mark node %s: %w", b.o.NodeName, err)
		}
		b.o.Log.Info("node marked control plane", "node", b.o.NodeName)
		return true, nil
	})
}

func b64(b []byte) string { return base64.StdEncoding.EncodeToString(b) }

// kubeletFinalize is kubeadm's kubelet-finalize phase. First boot gives the control
// plane's kubelet a kubelet.conf with an embedded client certificate; kubelet copies it to
// nodeimage.KubeletClientCertPath at its start and rotates it there. Pointing kubelet.conf
// at that file keeps kubelet on its rotated certificate across restarts (the embedded one
// would be copied over it again, and expire after a year). Nothing to do before kubelet made the
// file, or once kubelet.conf refers to it.
func (b *bootstrap) kubeletFinalize(context.Context) (bool, error) {
	path := filepath.Join(b.o.Root, nodeimage.KubeletConfPath)
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("kubelet-finalize: %w", err)
	}
	kc, err := kubeconfig.Decode(data)
	if err != nil {
		return false, fmt.Errorf("kubelet-finalize: %s: %w", nodeimage.KubeletConfPath, err)
	}
	if len(kc.Users) != 1 || len(kc.Clusters) != 1 || kc.Users[0].User.CertData == "" {
		return false, nil // not the embedded-certificate kubeconfig first boot writes
	}
	if _, err := os.Stat(filepath.Join(b.o.Root, nodeimage.KubeletClientCertPath)); err != nil {
		b.o.Log.Info("kubelet-finalize: kubelet has not stored its client certificate yet", "path", nodeimage.KubeletClientCertPath)
		return false, nil
	}
	cl, u := kc.Clusters[0], kc.Users[0]
	out := kubeconfig.New()
	out.Clusters = []kubeconfig.NamedCluster{{Name: cl.Name, Cluster: kubeconfig.Cluster{
		CAData: cl.Cluster.CAData, Server: cl.Cluster.Server, TLSServerName: cl.Cluster.TLSServerName}}}
	out.Contexts = []kubeconfig.NamedContext{{Name: kc.CurrentContext, Context: kubeconfig.Context{Cluster: cl.Name, User: u.Name}}}
	out.CurrentContext = kc.CurrentContext
	out.Users = []kubeconfig.NamedUser{{Name: u.Name, User: kubeconfig.User{CertFile: nodeimage.KubeletClientCertPath, KeyFile: nodeimage.KubeletClientCertPath}}}
	newData, err := out.Encode()
	if err != nil {
		return false, fmt.Errorf("kubelet-finalize: %w", err)
	}
	if err := atomicfile.Write(path, newData, atomicfile.Options{Mode: 0o600}); err != nil {
		return false, fmt.Errorf("kubelet-finalize: %w", err)
	}
	b.o.Log.Info("kubelet.conf now uses kubelet's rotated client certificate", "path", nodeimage.KubeletClientCertPath)
	return true, nil
}
