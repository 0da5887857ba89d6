package publish

import (
	"context"
	"io"
)

// Publisher makes one bake output a bootable image in one cloud. Each cloud is one package
// beside this one (aws, gce): a Publisher, its request and its Result, and its fake in
// publishtest.
type Publisher interface {
	// Publish makes im the cloud's image, or returns the image an earlier publish made of the
	// same file once the publisher has checked that it holds exactly this file. im is hashed
	// against its metadata before any request. A failure part-way deletes what the call made,
	// or its error names what is left.
	Publish(ctx context.Context, im *Image) (Result, error)
}

// Result is what a publish made or found. It marshals to the JSON `kiln publish <cloud> -o
// json` prints for the next step of a CI job.
type Result interface {
	// WriteText writes the result as `kiln publish <cloud>` prints it.
	WriteText(w io.Writer) error
}
