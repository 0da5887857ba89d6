package kube

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"strings"

	"gopkg.in/yaml.v3"
)

// object is one Kubernetes object as its JSON/YAML document.
type object map[string]any

// kind is the object's kind, e.g. DaemonSet.
func (o object) kind() string { s, _ := o["kind"].(string); return s }

// apiVersion is the object's group/version, e.g. apps/v1.
func (o object) apiVersion() string { s, _ := o["apiVersion"].(string); return s }

func (o object) meta(key string) string {
	var m map[string]any
	switch v := o["metadata"].(type) {
	case map[string]any:
		m = v
	case object:
		m = v
	}
	s, _ := m[key].(string)
	return s
}

// name is metadata.name.
func (o object) name() string { return o.meta("name") }

// namespace is metadata.namespace.
func (o object) namespace() string { return o.meta("namespace") }

// String names the object as kubectl does, e.g. "daemonset kube-system/kube-proxy".
func (o object) String() string {
	if ns := o.namespace(); ns != "" {
		return strings.ToLower(o.kind()) + " " + ns + "/" + o.name()
	}
	return strings.ToLower(o.kind()) + " " + o.name()
}

// resource is how the API serves one kind.
type resource struct {
	plural     string
	namespaced bool
}

// resources are the kinds first boot writes. Anything else in a manifest is an error:
// kiln-init has no discovery client.
var resources = map[string]resource{
	"Namespace":           {"namespaces", false},
	"Node":                {"nodes", false},
	"ServiceAccount":      {"serviceaccounts", true},
	"ConfigMap":           {"configmaps", true},
	"Secret":              {"secrets", true},
	"Service":             {"services", true},
	"DaemonSet":           {"daemonsets", true},
	"Deployment":          {"deployments", true},
	"PodDisruptionBudget": {"poddisruptionbudgets", true},
	"ClusterRole":         {"clusterroles", false},
	"ClusterRoleBinding":  {"clusterrolebindings", false},
	"Role":                {"roles", true},
	"RoleBinding":         {"rolebindings", true},
}

// path is the object's URL path, e.g. /apis/apps/v1/namespaces/kube-system/daemonsets/kube-proxy.
func (o object) path() (string, error) {
	r, ok := resources[o.kind()]
	if !ok {
		return "", fmt.Errorf("%s: kind %q is not one kiln-init can apply", o, o.kind())
	}
	gv := o.apiVersion()
	if gv == "" {
		return "", fmt.Errorf("%s: no apiVersion", o)
	}
	if o.name() == "" {
		return "", fmt.Errorf("%s: no metadata.name", o.kind())
	}
	p := "/apis/" + gv
	if !strings.Contains(gv, "/") {
		p = "/api/" + gv
	}
	if r.namespaced {
		if o.namespace() == "" {
			return "", fmt.Errorf("%s: no metadata.namespace", o)
		}
		p += "/namespaces/" + url.PathEscape(o.namespace())
	}
	return p + "/" + r.plural + "/" + url.PathEscape(o.name()), nil
}

// parseManifests reads a multi-document YAML stream. name (the file) starts errors.
// Empty documents are skipped; every other one must be an object of a kind path knows.
func parseManifests(data []byte, name string) ([]object, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var objs []object
	for i := 1; ; i++ {
		var m map[string]any // not object: nested mappings must decode as plain maps
		err := dec.Decode(&m)
		o := object(m)
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: document %d: %w", name, i, err)
		}
		if len(o) == 0 {
			continue
		}
		if _, err := o.path(); err != nil {
			return nil, fmt.Errorf("%s: document %d: %w", name, i, err)
		}
		objs = append(objs, o)
	}
}

// fieldManager is the server-side apply manager kiln-init writes as.
const fieldManager = "kiln-init"

// apply server-side applies obj (forcing conflicts, as `kubectl apply --server-side
// --force-conflicts`) and reports whether the object changed: a new object or a new
// resourceVersion. Applying the same object again changes nothing. The apply carries the
// resourceVersion read just before as a precondition: a controller writing the object in
// between (a Deployment's status) makes the server refuse it and the read and apply are
// done again, so that another writer's change is never taken for this one's.
func (c *Client) apply(ctx context.Context, obj object) (changed bool, err error) {
	p, err := obj.path()
	if err != nil {
		return false, err
	}
	const tries = 5
	for i := 1; ; i++ {
		changed, err := c.applyOnce(ctx, p, obj)
		if err == nil || !isConflict(err) || i == tries {
			return changed, err
		}
	}
}

func (c *Client) applyOnce(ctx context.Context, p string, obj object) (changed bool, err error) {
	var before struct {
		Metadata struct{ ResourceVersion string } `json:"metadata"`
	}
	switch err := c.get(ctx, p, &before); {
	case isNotFound(err):
	case err != nil:
		return false, fmt.Errorf("apply %s: %w", obj, err)
	}
	send := obj
	if rv := before.Metadata.ResourceVersion; rv != "" {
		send = withResourceVersion(obj, rv)
	}
	body, err := json.Marshal(send)
	if err != nil {
		return false, fmt.Errorf("apply %s: %w", obj, err)
	}
	after := before
	q := "?fieldManager=" + fieldManager + "&force=true"
	if err := c.do(ctx, http.MethodPatch, p+q, contentApply, body, &after); err != nil {
		return false, fmt.Errorf("apply %s: %w", obj, err)
	}
	return after.Metadata.ResourceVersion != before.Metadata.ResourceVersion, nil
}

// withResourceVersion is a copy of obj whose metadata carries resourceVersion rv (obj's
// own metadata is not changed).
func withResourceVersion(obj object, rv string) object {
	out := maps.Clone(obj)
	meta, _ := obj["metadata"].(map[string]any)
	meta = maps.Clone(meta)
	if meta == nil {
		meta = map[string]any{}
	}
	meta["resourceVersion"] = rv
	out["metadata"] = meta
	return out
}

// create creates obj unless an object of that name exists; it reports whether it
// created it. An existing object is left as it is (a bootstrap token keeps its expiry).
func (c *Client) create(ctx context.Context, obj object) (created bool, err error) {
	p, err := obj.path()
	if err != nil {
		return false, err
	}
	switch err := c.get(ctx, p, nil); {
	case err == nil:
		return false, nil
	case !isNotFound(err):
		return false, fmt.Errorf("create %s: %w", obj, err)
	}
	body, err := json.Marshal(obj)
	if err != nil {
		return false, fmt.Errorf("create %s: %w", obj, err)
	}
	collection := p[:strings.LastIndex(p, "/")]
	switch err := c.do(ctx, http.MethodPost, collection, contentJSON, body, nil); {
	case err == nil:
		return true, nil
	case statusIs(err, http.StatusConflict): // created meanwhile (AlreadyExists)
		return false, nil
	default:
		return false, fmt.Errorf("create %s: %w", obj, err)
	}
}
