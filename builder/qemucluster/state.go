package qemucluster

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/kilnproject/kiln/internal/atomicfile"
)

// ErrNoCluster is returned for a state directory without a cluster.
var ErrNoCluster = errors.New("no cluster")

// Load reads the cluster in state directory dir.
func Load(dir string) (*State, error) {
	data, err := os.ReadFile(filepath.Join(dir, stateFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%s: %w here (kiln cluster up creates one; --state-dir names another)", dir, ErrNoCluster)
	}
	if err != nil {
		return nil, fmt.Errorf("cluster state: %w", err)
	}
	var s State
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, stateFile), err)
	}
	if s.Name == "" || len(s.Nodes) == 0 {
		return nil, fmt.Errorf("%s: no cluster name or nodes", filepath.Join(dir, stateFile))
	}
	s.Dir = dir
	return &s, nil
}

func (s *State) save() error {
	data, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(s.file(stateFile), append(data, '\n'), atomicfile.Options{Mode: 0o600})
}

// refuseExisting refuses a state directory that holds a cluster or anything else.
func refuseExisting(dir, name string) error {
	if _, err := os.Stat(filepath.Join(dir, stateFile)); err == nil {
		ref := "--name " + name
		if filepath.Clean(dir) != DefaultStateDir(name) {
			ref = "--state-dir " + dir
		}
		return fmt.Errorf("cluster %s already exists in %s: `kiln cluster status %s` shows it, `kiln cluster start %s` starts its stopped nodes, `kiln cluster down %s` removes it", name, dir, ref, ref, ref)
	}
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("state directory: %w", err)
	}
	if len(entries) > 0 {
		return fmt.Errorf("state directory %s is not empty and holds no cluster: remove it or choose another --state-dir", dir)
	}
	return nil
}
