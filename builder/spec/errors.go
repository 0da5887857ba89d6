package spec

import (
	"fmt"
	"strconv"

	"github.com/kilnproject/kiln/internal/strictyaml"
)

// Pos is a place in a document, used to point at the source of a value
// when a later stage (lock, fetch, bake) finds a problem with it.
type Pos struct {
	File string
	Line int
}

func (p Pos) String() string {
	if p.Line == 0 {
		return p.File
	}
	return p.File + ":" + strconv.Itoa(p.Line)
}

// Error is one problem in a document. Its message reads
// "file:line: field: problem"; Field is a dotted path such as
// "disk.size" or "artifacts[0].sha256" and may be empty for syntax errors.
type Error = strictyaml.Error

// Errorf returns an *Error at p; other stages use it to report a problem
// with a value at the place it was written.
func Errorf(p Pos, field, format string, a ...any) *Error {
	return &Error{File: p.File, Line: p.Line, Field: field, Err: fmt.Errorf(format, a...)}
}
