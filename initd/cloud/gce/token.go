package gce

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"
)

const (
	// tokenPath is the default service account's access token on the metadata server.
	tokenPath = "instance/service-accounts/default/token"
	// tokenTimeout bounds one token request.
	tokenTimeout = 30 * time.Second
	// tokenEarly is how long before its expiry a token is replaced. The metadata server
	// hands out a new token once the one it holds has less than five minutes left.
	tokenEarly = time.Minute
)

// metadataToken is the instance's default service account's access token, from the GCE
// metadata server, kept until tokenEarly before it expires.
type metadataToken struct {
	md *metadataClient
	// now is the clock; nil means time.Now.
	now func() time.Time

	mu      sync.Mutex
	value   string
	refresh time.Time // when value is to be replaced
}

func newMetadataToken(md *metadataClient) *metadataToken { return &metadataToken{md: md} }

// token implements tokenSource.
func (m *metadataToken) token(ctx context.Context) (string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now
	if m.now != nil {
		now = m.now
	}
	if m.value != "" && now().Before(m.refresh) {
		return m.value, nil
	}
	ctx, cancel := context.WithTimeout(ctx, tokenTimeout)
	defer cancel()
	asked := now()
	body, err := m.md.get(ctx, tokenPath)
	if err != nil {
		return "", fmt.Errorf("GCE metadata %s: %w", tokenPath, err)
	}
	var t struct {
		AccessToken string `json:"access_token"`
		ExpiresIn   int64  `json:"expires_in"`
		TokenType   string `json:"token_type"`
	}
	switch err := json.Unmarshal(body, &t); {
	case err != nil:
		return "", fmt.Errorf("GCE metadata %s: %w", tokenPath, err)
	case t.AccessToken == "":
		return "", fmt.Errorf("GCE metadata %s: no access_token in the answer", tokenPath)
	case t.TokenType != "" && !strings.EqualFold(t.TokenType, "bearer"):
		return "", fmt.Errorf("GCE metadata %s: token type %q, want Bearer", tokenPath, t.TokenType)
	}
	// The lifetime counts from the request, so that the time the answer took is not
	// taken for validity left; an access token lives an hour, a day is plenty of bound.
	life := time.Duration(min(max(t.ExpiresIn, 0), 24*60*60)) * time.Second
	m.value = t.AccessToken
	m.refresh = asked.Add(life - tokenEarly)
	return m.value, nil
}
