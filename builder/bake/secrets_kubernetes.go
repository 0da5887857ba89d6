package bake

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"gopkg.in/yaml.v3"
)

// tokenContext reports whether the line before a token at i names one within tokenReach
// bytes: "token: ", "--token ", "TOKEN=", "Authorization: Bearer ".
func tokenContext(win []byte, i int) bool {
	from := max(0, i-tokenReach)
	if nl := bytes.LastIndexByte(win[from:i], '\n'); nl >= 0 {
		from += nl + 1
	}
	before := bytes.ToLower(win[from:i])
	return bytes.Contains(before, []byte("token")) || bytes.Contains(before, []byte("bearer"))
}

// tokenReach is how far after "token" or "bearer" on its line a token still counts (within
// scanLookbehind, which the window keeps).
const tokenReach = 64

// isToken reports whether the '.' at i splits a bootstrap token: 6 of [a-z0-9] before it and
// 16 after, as whole words (no letter, digit or '_' on either side).
func isToken(win []byte, i int) bool {
	if i < 6 || i+17 > len(win) {
		return false
	}
	for _, c := range win[i-6 : i] {
		if !isTokenChar(c) {
			return false
		}
	}
	for _, c := range win[i+1 : i+17] {
		if !isTokenChar(c) {
			return false
		}
	}
	if i > 6 && isWordChar(win[i-7]) {
		return false
	}
	if i+17 < len(win) && isWordChar(win[i+17]) {
		return false
	}
	return true
}

func isTokenChar(c byte) bool { return c >= 'a' && c <= 'z' || c >= '0' && c <= '9' }

func isWordChar(c byte) bool {
	return isTokenChar(c) || c >= 'A' && c <= 'Z' || c == '_'
}

const bootstrapTokenType = "bootstrap.kubernetes.io/token"

// manifest is what a kubeconfig, a Secret or a List of them holds that can be a secret.
type manifest struct {
	Kind     string `yaml:"kind"`
	Type     string `yaml:"type"`
	Metadata struct {
		Name string `yaml:"name"`
	} `yaml:"metadata"`
	Data       map[string]string `yaml:"data"`
	StringData map[string]string `yaml:"stringData"`
	Users      []struct {
		Name string `yaml:"name"`
		User struct {
			ClientKeyData string `yaml:"client-key-data"`
			Token         string `yaml:"token"`
		} `yaml:"user"`
	} `yaml:"users"`
	Clusters []yaml.Node `yaml:"clusters"`
	Items    []manifest  `yaml:"items"`
}

// manifestSecrets parses b as YAML or JSON documents and reports a kubeconfig's user client
// keys and tokens, and bootstrap token Secrets. Lines are where the value (or else its field)
// first appears in b.
func manifestSecrets(b []byte) (out []Finding) {
	lineOf := func(needles ...string) int {
		for _, n := range needles {
			if i := bytes.Index(b, []byte(n)); n != "" && i >= 0 {
				return bytes.Count(b[:i], []byte{'\n'}) + 1
			}
		}
		return 1
	}
	var check func(m manifest, depth int)
	check = func(m manifest, depth int) {
		if m.Kind == "Config" || (m.Kind == "" && len(m.Users) > 0 && len(m.Clusters) > 0) {
			for i, u := range m.Users {
				at := fmt.Sprintf("kubeconfig users[%d] (%s)", i, u.Name)
				if isClientKey(u.User.ClientKeyData) {
					out = append(out, Finding{Line: lineOf(u.User.ClientKeyData, "client-key-data"), Kind: at + " client-key-data: a private key"})
				}
				if isBearerToken(u.User.Token) {
					out = append(out, Finding{Line: lineOf(u.User.Token, "token"), Kind: at + " token"})
				}
			}
		}
		if m.Kind == "Secret" && m.Type == bootstrapTokenType {
			id, secret := m.StringData["token-id"], m.StringData["token-secret"]
			if d, err := base64.StdEncoding.DecodeString(m.Data["token-id"]); err == nil && id == "" {
				id = string(d)
			}
			if d, err := base64.StdEncoding.DecodeString(m.Data["token-secret"]); err == nil && secret == "" {
				secret = string(d)
			}
			if isBootstrapToken(id + "." + secret) {
				out = append(out, Finding{Line: lineOf("token-secret"), Kind: "Kubernetes bootstrap token Secret (bootstrap-token-" + id + ")"})
			}
		}
		if depth < 4 {
			for _, it := range m.Items {
				check(it, depth+1)
			}
		}
	}
	defer func() {
		if recover() != nil { // the YAML parser on text that is not YAML: nothing parsed
			out = nil
		}
	}()
	d := yaml.NewDecoder(bytes.NewReader(b))
	for range 1000 {
		var m manifest
		err := d.Decode(&m)
		var te *yaml.TypeError
		if err != nil && !errors.As(err, &te) {
			break // the end, or not YAML
		}
		check(m, 0)
	}
	return out
}

// isClientKey reports whether s, a kubeconfig's client-key-data, is base64 of a private key
// (PEM or DER).
func isClientKey(s string) bool {
	b, err := base64.StdEncoding.DecodeString(strings.Join(strings.Fields(s), ""))
	if err != nil || len(b) == 0 {
		return false
	}
	for off := 0; ; {
		i := bytes.Index(b[off:], pemMarker)
		if i < 0 {
			break
		}
		if _, _, ok := pemKey(b, off+i); ok {
			return true
		}
		off += i + len(pemMarker)
	}
	return b[0] == 0x30 && derKey(b) != ""
}

// isBearerToken reports whether s, a kubeconfig user's token, is one: a bootstrap token, a
// JWT (a service account token: a header that decodes to JSON naming its algorithm), or an
// opaque token of at least 20 characters of a token alphabet with letters and digits. A
// placeholder ("<token>", "REDACTED", "${TOKEN}") is none of these.
func isBearerToken(s string) bool {
	if isBootstrapToken(s) {
		return true
	}
	if parts := strings.Split(s, "."); len(parts) == 3 {
		h, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(parts[0], "="))
		var hdr struct {
			Alg string `json:"alg"`
		}
		if err == nil && json.Unmarshal(h, &hdr) == nil && hdr.Alg != "" {
			return true
		}
	}
	if len(s) < 20 {
		return false
	}
	var letters, digits bool
	for _, c := range []byte(s) {
		switch {
		case c >= '0' && c <= '9':
			digits = true
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z':
			letters = true
		case strings.IndexByte("-._~+/=", c) >= 0:
		default:
			return false
		}
	}
	return letters && digits
}

func isBootstrapToken(s string) bool {
	return len(s) == 23 && s[6] == '.' && isToken([]byte(s), 6)
}
