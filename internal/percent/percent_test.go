package percent

import "testing"

func TestEncode(t *testing.T) {
	for _, tc := range []struct{ in, keep, want string }{
		{"AZaz09-._~", "", "AZaz09-._~"},
		{"a b/c", "", "a%20b%2Fc"},
		{"a b/c", "/", "a%20b/c"},
		{"v1.2.3+incompatible", "+", "v1.2.3+incompatible"},
		{"v1.2.3+incompatible", "", "v1.2.3%2Bincompatible"},
		{"é*", "", "%C3%A9%2A"},
		{"", "", ""},
	} {
		if got := Encode(tc.in, tc.keep); got != tc.want {
			t.Errorf("Encode(%q, %q) = %q, want %q", tc.in, tc.keep, got, tc.want)
		}
	}
}
