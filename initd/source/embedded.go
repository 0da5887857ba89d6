package source

import "context"

// EmbeddedPath is where an image bakes its default config.
const EmbeddedPath = "/usr/lib/kiln/config.ign"

// Embedded is a config file baked into the image. It is usually absent.
type Embedded struct {
	// Path of the file; "" means EmbeddedPath.
	Path string
}

// Name implements Provider.
func (Embedded) Name() string { return "embedded" }

func (e Embedded) path() string {
	if e.Path == "" {
		return EmbeddedPath
	}
	return e.Path
}

// Probe implements Provider: true when the file exists.
func (e Embedded) Probe(context.Context) bool { return isRegular(e.path()) }

// Fetch implements Provider.
func (e Embedded) Fetch(context.Context) ([]byte, error) { return readFileLimited(e.path()) }
