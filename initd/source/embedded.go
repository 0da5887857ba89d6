package source

import (
	"context"

	"github.com/kilnproject/kiln/internal/nodeimage"
)

// Embedded is a config file baked into the image. It is usually absent.
type Embedded struct {
	// Path of the file; "" means nodeimage.EmbeddedConfigPath.
	Path string
}

// Name implements Provider.
func (Embedded) Name() string { return "embedded" }

func (e Embedded) path() string {
	if e.Path == "" {
		return nodeimage.EmbeddedConfigPath
	}
	return e.Path
}

// Probe implements Provider: true when the file exists.
func (e Embedded) Probe(context.Context) bool { return isRegular(e.path()) }

// Fetch implements Provider.
func (e Embedded) Fetch(context.Context) ([]byte, error) { return readFileLimited(e.path()) }
