package qemucluster

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"time"

	"github.com/kilnproject/kiln/internal/kubeconfig"
)

// apiClient talks to the API through the control planes' forwarded ports with admin.conf's
// credentials.
type apiClient struct {
	http  *http.Client
	ports []int
}

func (s *State) apiClient() (*apiClient, error) {
	data, err := os.ReadFile(s.Kubeconfig())
	if err != nil {
		return nil, fmt.Errorf("admin kubeconfig: %w", err)
	}
	kc, err := kubeconfig.Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", s.Kubeconfig(), err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(kc.CAPEM) {
		return nil, fmt.Errorf("%s: no CA certificate", s.Kubeconfig())
	}
	cert, err := tls.X509KeyPair(kc.CertPEM, kc.KeyPEM)
	if err != nil {
		return nil, fmt.Errorf("%s: client certificate: %w", s.Kubeconfig(), err)
	}
	c := &apiClient{http: &http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}, ServerName: apiTLSName},
	}}}
	for _, n := range s.Nodes {
		if n.APIPort != 0 && s.Running(n.Name) != 0 {
			c.ports = append(c.ports, n.APIPort)
		}
	}
	return c, nil
}

// apiTLSName is the name admin.conf checks the API server's certificate against (always
// one of its names, whatever port it is forwarded to).
const apiTLSName = "kubernetes"

// get decodes GET path from the first control plane that answers.
func (c *apiClient) get(ctx context.Context, path string, v any) error {
	if len(c.ports) == 0 {
		return errors.New("no control plane is running")
	}
	var errs []error
	for _, p := range c.ports {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("https://127.0.0.1:%d%s", p, path), nil)
		if err != nil {
			return err
		}
		resp, err := c.http.Do(req)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		err = func() error {
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("GET %s on port %d: %s", path, p, resp.Status)
			}
			return json.NewDecoder(resp.Body).Decode(v)
		}()
		if err == nil {
			return nil
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// readyCondition is a node's Ready condition: its status and when its kubelet last
// reported it.
type readyCondition struct {
	Status    string
	Heartbeat time.Time
}

// nodeReady is each registered node's Ready condition ("True", "False", "Unknown").
func (c *apiClient) nodeReady(ctx context.Context) (map[string]readyCondition, error) {
	var list struct {
		Items []struct {
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
			Status struct {
				Conditions []struct {
					Type          string    `json:"type"`
					Status        string    `json:"status"`
					LastHeartbeat time.Time `json:"lastHeartbeatTime"`
				} `json:"conditions"`
			} `json:"status"`
		} `json:"items"`
	}
	if err := c.get(ctx, "/api/v1/nodes", &list); err != nil {
		return nil, err
	}
	ready := map[string]readyCondition{}
	for _, it := range list.Items {
		ready[it.Metadata.Name] = readyCondition{Status: "Unknown"}
		for _, cond := range it.Status.Conditions {
			if cond.Type == "Ready" {
				ready[it.Metadata.Name] = readyCondition{Status: cond.Status, Heartbeat: cond.LastHeartbeat}
			}
		}
	}
	return ready, nil
}

// restarts is, per node, how often the containers of kube-system's pods on it (the static
// pods' mirrors, kube-proxy, CoreDNS) restarted, and which: "kube-apiserver 2".
func (c *apiClient) restarts(ctx context.Context) (map[string]Restarts, error) {
	var list struct {
		Items []struct {
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
			Spec struct {
				NodeName string `json:"nodeName"`
			} `json:"spec"`
			Status struct {
				InitContainerStatuses []containerStatus `json:"initContainerStatuses"`
				ContainerStatuses     []containerStatus `json:"containerStatuses"`
			} `json:"status"`
		} `json:"items"`
	}
	if err := c.get(ctx, "/api/v1/namespaces/kube-system/pods", &list); err != nil {
		return nil, err
	}
	out := map[string]Restarts{}
	for _, it := range list.Items {
		r := out[it.Spec.NodeName]
		for _, cs := range append(it.Status.InitContainerStatuses, it.Status.ContainerStatuses...) {
			if cs.RestartCount > 0 {
				r.Count += cs.RestartCount
				r.Containers = append(r.Containers, fmt.Sprintf("%s/%s %d", it.Metadata.Name, cs.Name, cs.RestartCount))
			}
		}
		out[it.Spec.NodeName] = r
	}
	return out, nil
}

type containerStatus struct {
	Name         string `json:"name"`
	RestartCount int    `json:"restartCount"`
}

// Restarts counts a node's kube-system container restarts.
type Restarts struct {
	Count int `json:"count"`
	// Containers are "<pod>/<container> <restarts>" of each container that restarted.
	Containers []string `json:"containers,omitempty"`
}
