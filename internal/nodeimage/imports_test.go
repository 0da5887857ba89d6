package nodeimage

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/kilnproject/kiln/"

// builderMayImport are the node-side packages the bake runs the way the node does; each says
// why in its doc comment.
var builderMayImport = []string{"initd/config", "initd/pki", "initd/rootpath", "initd/systemd"}

// testOnly are the packages of helpers and fakes for tests: only test files may import them.
var testOnly = []string{"internal/testkit", "internal/cloudfake", "builder/publish/publishtest", "initd/etcdvolume/etcdvolumetest", "initd/dns/dnstest"}

// phases are kiln-init's boot phases: each folder holds one, with the packages only it uses.
// Only kiln-init's main (initd/cmd) ties them together.
var phases = []string{"initd/stage1", "initd/firstboot"}

// The import rule of docs/architecture.md: internal/ imports neither builder/ nor initd/,
// initd/ never imports builder/, and builder/ imports only the node-side packages it runs the
// way the node does; on the node, no phase imports another, and the packages the phases share
// import no phase. Test files count too (except for the phase rule), but only they may import
// the test-only packages.
func TestImportRule(t *testing.T) {
	out, err := exec.Command("go", "list", "-f",
		`{{.ImportPath}} {{join .Imports " "}} | {{join .TestImports " "}} {{join .XTestImports " "}}`,
		module+"...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	checked := 0
	for line := range strings.Lines(string(out)) {
		fields := strings.Fields(line)
		pkg := strings.TrimPrefix(fields[0], module)
		inTests := false
		for _, imp := range fields[1:] {
			if imp == "|" {
				inTests = true
				continue
			}
			imp, ok := strings.CutPrefix(imp, module)
			if !ok {
				continue
			}
			why := forbidden(pkg, imp)
			if why == "" && !inTests && slices.Contains(testOnly, imp) && !slices.Contains(testOnly, pkg) {
				why = "only test files may import it"
			}
			if why == "" && !inTests {
				why = crossesPhase(pkg, imp)
			}
			if why != "" {
				t.Errorf("%s imports %s: %s", pkg, imp, why)
			}
			checked++
		}
	}
	if checked == 0 {
		t.Fatal("go list named no imports inside the module")
	}
}

func forbidden(pkg, imp string) string {
	top := func(p string) string { return strings.SplitN(p, "/", 2)[0] }
	switch {
	case top(pkg) == "internal" && (top(imp) == "builder" || top(imp) == "initd"):
		return "internal/ packages are leaves shared by both programs"
	case top(pkg) == "initd" && top(imp) == "builder":
		return "the node never depends on the builder"
	case top(pkg) == "builder" && top(imp) == "initd" && !slices.Contains(builderMayImport, imp):
		return "the builder may import only " + strings.Join(builderMayImport, ", ")
	}
	return ""
}

// crossesPhase says why pkg may not import imp across kiln-init's phases, or "". Tests may:
// kube's render the real templates with first boot's renderer.
func crossesPhase(pkg, imp string) string {
	if strings.HasPrefix(pkg, "initd/") && !strings.HasPrefix(pkg, "initd/cmd/") && phaseOf(imp) != "" && phaseOf(imp) != phaseOf(pkg) {
		return "a phase of kiln-init imports no other phase, and what the phases share imports none"
	}
	return ""
}

// phaseOf is the phase folder p belongs to, or "" for a package the phases share.
func phaseOf(p string) string {
	for _, ph := range phases {
		if p == ph || strings.HasPrefix(p, ph+"/") {
			return ph
		}
	}
	return ""
}

// The node's binaries link only what they use: the initramfs carries kiln-stage1, which
// needs neither a cloud's API nor etcd's client; kiln-init on the root talks to the clouds
// with small REST clients of its own, not their generated SDKs (tens of MB for a few calls).
func TestNodeBinariesLeaveOut(t *testing.T) {
	for _, tc := range []struct {
		cmd      string
		leaveOut []string
	}{
		{"initd/cmd/kiln-stage1", []string{"github.com/aws/aws-sdk-go-v2/service/", "github.com/aws/smithy-go",
			"google.golang.org/api/", "google.golang.org/grpc", "cloud.google.com/", "go.etcd.io/", "go.opentelemetry.io/"}},
		{"initd/cmd/kiln-init", []string{"github.com/aws/aws-sdk-go-v2/service/", "github.com/aws/aws-sdk-go-v2/config",
			"github.com/aws/smithy-go", "google.golang.org/api/", "cloud.google.com/", "golang.org/x/oauth2", "go.opentelemetry.io/"}},
	} {
		out, err := exec.Command("go", "list", "-deps", module+tc.cmd).Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", tc.cmd, err)
		}
		deps := strings.Fields(string(out))
		if !slices.Contains(deps, module+tc.cmd) {
			t.Fatalf("go list -deps %s does not name it:\n%s", tc.cmd, out)
		}
		for _, d := range deps {
			for _, p := range tc.leaveOut {
				if strings.HasPrefix(d, p) {
					t.Errorf("%s links %s", tc.cmd, d)
				}
			}
		}
	}
}
