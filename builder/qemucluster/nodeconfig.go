package qemucluster

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"github.com/kilnproject/kiln/initd/config"
	"github.com/kilnproject/kiln/internal/atomicfile"
)

// nodeExtra is the Butane config added to what cluster init wrote for node n: its static
// address on the link (the primary interface: the default route, which leads nowhere on
// offline guests) and /etc/hosts with every name of the cluster.
func (s *State) nodeExtra(n *Node) string {
	var b strings.Builder
	fmt.Fprintf(&b, `variant: fcos
version: 1.6.0
storage:
  files:
    - path: /etc/systemd/network/10-kiln-cluster.network
      mode: 0644
      overwrite: true
      contents:
        inline: |
          [Match]
          MACAddress=%s
          [Network]
          Address=%s/%d
          Gateway=%s1
    - path: /etc/hosts
      mode: 0644
      overwrite: true
      contents:
        inline: |
`, n.MAC, n.Address, subnetBits, subnetPrefix)
	for _, l := range strings.Split(strings.TrimRight(s.HostsFile(), "\n"), "\n") {
		b.WriteString("          " + l + "\n")
	}
	if len(s.SSHKeys) > 0 {
		// up --ssh-key: root takes the keys, and the ssh server (installed, not enabled)
		// runs; its port is forwarded to the host.
		b.WriteString("passwd:\n  users:\n    - name: root\n      ssh_authorized_keys:\n")
		for _, k := range s.SSHKeys {
			q, _ := json.Marshal(k)
			fmt.Fprintf(&b, "        - %s\n", q)
		}
		fmt.Fprintf(&b, "systemd:\n  units:\n    - name: %s\n      enabled: true\n", config.SSHUnit)
	}
	return b.String()
}

// writeNodeConfig merges node n's cluster init config (ign) with nodeExtra into its
// config.ign (0600: it holds the cluster's keys).
func (s *State) writeNodeConfig(n *Node, ign string) error {
	raw, err := os.ReadFile(ign)
	if err != nil {
		return fmt.Errorf("node %s: %w", n.Name, err)
	}
	base, err := config.Parse(raw)
	if err != nil {
		return fmt.Errorf("node %s: %s: %w", n.Name, ign, err)
	}
	extraJSON, err := config.TranslateButane([]byte(s.nodeExtra(n)))
	if err != nil {
		return fmt.Errorf("node %s: network and hosts config: %w", n.Name, err)
	}
	extra, err := config.Parse(extraJSON)
	if err != nil {
		return fmt.Errorf("node %s: network and hosts config: %w", n.Name, err)
	}
	merged, err := config.Merge(base, extra).JSON()
	if err != nil {
		return fmt.Errorf("node %s: %w", n.Name, err)
	}
	return atomicfile.Write(s.nodeFile(n.Name, configFile), merged, atomicfile.Options{Mode: 0o600, DirMode: 0o700})
}
