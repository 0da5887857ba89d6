package config

import "github.com/kilnproject/kiln/internal/strictyaml"

// NodeError is a problem with one field of a YAML document such as node.yaml: its file, its
// line (0 when the field is absent), the field's path and what is wrong.
type NodeError = strictyaml.Error
