package nodeimage

import "testing"

// Every runtime a profile may name means something on the node, and nothing else does.
func TestRuntimeNames(t *testing.T) {
	for _, name := range RuntimeNames() {
		r, ok := RuntimeOf(name)
		if !ok || r.Name != name || r.Namespace == "" || r.Socket == "" {
			t.Errorf("RuntimeOf(%q) = %+v, %v", name, r, ok)
		}
	}
	if len(runtimes) != len(RuntimeNames()) {
		t.Errorf("%d runtimes, %d names", len(runtimes), len(RuntimeNames()))
	}
	if r, ok := RuntimeOf(""); !ok || r.Name != RuntimeNames()[0] {
		t.Errorf(`RuntimeOf("") = %+v, want the default`, r)
	}
	if _, ok := RuntimeOf("cri-o"); ok {
		t.Error("RuntimeOf(cri-o) is known")
	}
}
