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

// Object is one Kubernetes object as its JSON/YAML document.
type Object map[string]any

// Kind is the object's kind, e.g. DaemonSet.
func (o Object) Kind() string { s, _ := o["kind"].(string); return s }

// APIVersion is the object's group/version, e.g. apps/v1.
func (o Object) APIVersion() string { s, _ := o["apiVersion"].(string); return s }

func (o Object) meta(key string) string {
	var m map[string]any
	switch v := o["metadata"].(type) {
	case map[string]any:
		m = v
	case Object:
		m = v
	}
	s, _ := m[key].(string)
	return s
}

// Name is metadata.name.
func (o Object) Name() string { return o.meta("name") }

// Namespace is metadata.namespace.
func (o Object) Namespace() string { return o.meta("namespace") }

// String names the object as kubectl does, e.g. "daemonset kube-system/kube-proxy".
func (o Object) String() string {
	if ns := o.Namespace(); ns != "" {
		return strings.ToLower(o.Kind()) + " " + ns + "/" + o.Name()
	}
	return strings.ToLower(o.Kind()) + " " + o.Name()
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

// Path is the object's URL path, e.g. /apis/apps/v1/namespaces/kube-system/daemonsets/kube-proxy.
func (o Object) Path() (string, error) {
	r, ok := resources[o.Kind()]
	if !ok {
		return "", fmt.Errorf("%s: kind %q is not one kiln-init can apply", o, o.Kind())
	}
	gv := o.APIVersion()
	if gv == "" {
		return "", fmt.Errorf("%s: no apiVersion", o)
	}
	if o.Name() == "" {
		return "", fmt.Errorf("%s: no metadata.name", o.Kind())
	}
	p := "/apis/" + gv
	if !strings.Contains(gv, "/") {
		p = "/api/" + gv
	}
	if r.namespaced {
		if o.Namespace() == "" {
			return "", fmt.Errorf("%s: no metadata.namespace", o)
		}
		p += "/namespaces/" + url.PathEscape(o.Namespace())
	}
	return p + "/" + r.plural + "/" + url.PathEscape(o.Name()), nil
}

// ParseManifests reads a multi-document YAML stream. name (the file) starts errors.
// Empty documents are skipped; every other one must be an object of a kind Path knows.
func ParseManifests(data []byte, name string) ([]Object, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var objs []Object
	for i := 1; ; i++ {
		var m map[string]any // not Object: nested mappings must decode as plain maps
		err := dec.Decode(&m)
		o := Object(m)
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: document %d: %w", name, i, err)
		}
		if len(o) == 0 {
			continue
		}
		if _, err := o.Path(); err != nil {
			return nil, fmt.Errorf("%s: document %d: %w", name, i, err)
		}
		objs = append(objs, o)
	}
}

// FieldManager is the server-side apply manager kiln-init writes as.
const FieldManager = "kiln-init"

// Apply server-side applies obj (forcing conflicts, as `kubectl apply --server-side
// --force-conflicts`) and reports whether the object changed: a new object or a new
// resourceVersion. Applying the same object again changes nothing. The apply carries the
// resourceVersion read just before as a precondition: a controller writing the object in
// between (a Deployment's status) makes the server refuse it and the read and apply are
// done again, so that another writer's change is never taken for this one's.
func (c *Client) Apply(ctx context.Context, obj Object) (changed bool, err error) {
	p, err := obj.Path()
	if err != nil {
		return false, err
	}
	const tries = 5
	for i := 1; ; i++ {
		changed, err := c.applyOnce(ctx, p, obj)
		if err == nil || !IsConflict(err) || i == tries {
			return changed, err
		}
	}
}

func (c *Client) applyOnce(ctx context.Context, p string, obj Object) (changed bool, err error) {
	var before struct {
		Metadata struct{ ResourceVersion string } `json:"metadata"`
	}
	switch err := c.Get(ctx, p, &before); {
	case IsNotFound(err):
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
	q := "?fieldManager=" + FieldManager + "&force=true"
	if err := c.Do(ctx, http.MethodPatch, p+q, ContentApply, body, &after); err != nil {
		return false, fmt.Errorf("apply %s: %w", obj, err)
	}
	return after.Metadata.ResourceVersion != before.Metadata.ResourceVersion, nil
}

// withResourceVersion is a copy of obj whose metadata carries resourceVersion rv (obj's
// own metadata is not changed).
func withResourceVersion(obj Object, rv string) Object {
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

// Create creates obj unless an object of that name exists; it reports whether it
// created it. An existing object is left as it is (a bootstrap token keeps its expiry).
func (c *Client) Create(ctx context.Context, obj Object) (created bool, err error) {
	p, err := obj.Path()
	if err != nil {
		return false, err
	}
	switch err := c.Get(ctx, p, nil); {
	case err == nil:
		return false, nil
	case !IsNotFound(err):
		return false, fmt.Errorf("create %s: %w", obj, err)
	}
	body, err := json.Marshal(obj)
	if err != nil {
		return false, fmt.Errorf("create %s: %w", obj, err)
	}
	collection := p[:strings.LastIndex(p, "/")]
	switch err := c.Do(ctx, http.MethodPost, collection, ContentJSON, body, nil); {
	case err == nil:
		return true, nil
	case statusIs(err, http.StatusConflict): // created meanwhile (AlreadyExists)
		return false, nil
	default:
		return false, fmt.Errorf("create %s: %w", obj, err)
	}
}
