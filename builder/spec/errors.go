package spec

import (
	"fmt"
	"regexp"
	"strconv"
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
type Error struct {
	Pos
	Field string
	Msg   string
}

func (e *Error) Error() string {
	if e.Field == "" {
		return e.Pos.String() + ": " + e.Msg
	}
	return e.Pos.String() + ": " + e.Field + ": " + e.Msg
}

// Errorf returns an *Error at p; other stages use it to report a problem
// with a value at the place it was written.
func Errorf(p Pos, field, format string, a ...any) *Error {
	return &Error{Pos: p, Field: field, Msg: fmt.Sprintf(format, a...)}
}

var yamlLineErr = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// parserProblems are the messages of yaml.v3's parser (as opposed to its
// scanner); yaml.v3 v3.0.1 reports their line counting from 0.
var parserProblems = []string{
	"did not find expected <stream-start>", "did not find expected <document start>",
	"found undefined tag handle", "did not find expected node content",
	"did not find expected '-' indicator", "did not find expected key",
	"did not find expected ',' or ']'", "did not find expected ',' or '}'",
	"found duplicate %YAML directive", "found incompatible YAML document",
	"found duplicate %TAG directive",
}

// syntaxError turns a yaml.v3 parser error into an *Error at its line.
func syntaxError(file string, err error) *Error {
	msg := err.Error()
	if m := yamlLineErr.FindStringSubmatch(msg); m != nil {
		line, _ := strconv.Atoi(m[1])
		for _, p := range parserProblems {
			if m[2] == p {
				line++
			}
		}
		return &Error{Pos: Pos{File: file, Line: line}, Msg: "invalid YAML: " + m[2]}
	}
	if len(msg) > 6 && msg[:6] == "yaml: " {
		msg = msg[6:]
	}
	return &Error{Pos: Pos{File: file}, Msg: "invalid YAML: " + msg}
}
