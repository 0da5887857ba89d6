// Package spec reads kiln's two kinds of input documents: image definitions
// (images/<name>.yaml: what to build — base, disk, formats, kernel arguments,
// overlays) and role profiles (profiles/<role>.yaml: what a node of that role
// carries — pinned artifacts, the Kubernetes release and runtime, pre-pulled
// container images, systemd units, overlays, templates) — and profile overlays
// (`kiln bake --profile-overlay`: artifact and image sources replaced by name).
//
// Both are YAML, decoded through yaml.Node so that every problem is reported
// as "file:line: field: problem": unknown fields, wrong types, bad sizes,
// malformed digests and failed validations all name the line of the offending
// value. All problems found in a document are reported together
// (errors.Join of *Error values).
//
// Paths in documents are relative to the file that holds them and may use
// environment variables (${HOME}, ${KILN_CACHE}, any other); ${KILN_CACHE}
// defaults to CacheDir when unset. The schema reference is README.md in
// this directory.
package spec
