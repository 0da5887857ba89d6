package artifact

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
)

// registryRetry is how a registry request is retried: up to Steps attempts, the pause
// growing from Duration by Factor with 10% jitter (1s, 3s, 9s, 27s).
var registryRetry = remote.Backoff{Duration: time.Second, Factor: 3, Jitter: 0.1, Steps: 5}

// registryRetryStatus are the responses a registry request is retried on: request timeout,
// rate limiting and the server errors a proxy or an overloaded registry answers with.
var registryRetryStatus = []int{
	http.StatusRequestTimeout,
	http.StatusTooManyRequests,
	http.StatusInternalServerError,
	http.StatusBadGateway,
	http.StatusServiceUnavailable,
	http.StatusGatewayTimeout,
}

// RemoteOptions are the go-containerregistry options for every registry request of a bake
// (base image, pre-pulled images, kiln lock): credentials from kc, resolved per registry
// the way crane and ko do when kc is authn.DefaultKeychain (docker config "auths",
// "credHelpers", "credsStore"); up to 5 attempts per request on connection errors and on
// 408, 429 and 5xx answers; the user agent "kiln". A nil kc means authn.DefaultKeychain.
// Build them once and pass them to OCIResolver.Remote, ImageFetch.Remote and
// rootfs.OpenBase. Options appended after these override them.
func RemoteOptions(kc authn.Keychain) []remote.Option {
	if kc == nil {
		kc = authn.DefaultKeychain
	}
	return []remote.Option{
		remote.WithAuthFromKeychain(keychain{kc}),
		remote.WithRetryBackoff(registryRetry),
		remote.WithRetryStatusCodes(registryRetryStatus...),
		remote.WithUserAgent("kiln"),
	}
}

// remoteOptions are the options of one registry access: opts, or RemoteOptions(nil) when
// there are none, bound to ctx.
func remoteOptions(ctx context.Context, opts []remote.Option) []remote.Option {
	if opts == nil {
		opts = RemoteOptions(nil)
	}
	return append([]remote.Option{remote.WithContext(ctx)}, opts...)
}

// credentialsWhere says where the default keychain looks for credentials.
const credentialsWhere = "credentials are looked up in $DOCKER_CONFIG/config.json " +
	"(default ~/.docker/config.json): \"auths\" (docker login), and \"credHelpers\" or \"credsStore\" " +
	"naming a docker-credential-<name> helper on PATH"

// keychain names the registry and where credentials come from when looking them up fails
// (a config file that does not parse, a credential helper that is missing or fails).
type keychain struct{ authn.Keychain }

func (k keychain) Resolve(r authn.Resource) (authn.Authenticator, error) {
	return k.ResolveContext(context.Background(), r)
}

func (k keychain) ResolveContext(ctx context.Context, r authn.Resource) (authn.Authenticator, error) {
	a, err := authn.Resolve(ctx, k.Keychain, r)
	if err != nil {
		return nil, fmt.Errorf("registry %s: looking up credentials: %w (%s)", r.RegistryStr(), err, credentialsWhere)
	}
	return a, nil
}

// AuthError is a registry's refusal (401 or 403) of a request made without credentials or
// with the wrong ones.
type AuthError struct {
	Registry string
	Status   int
	Err      error
}

func (e *AuthError) Error() string {
	return fmt.Sprintf("%v: registry %s refused access (%d %s): missing or wrong credentials; %s",
		e.Err, e.Registry, e.Status, http.StatusText(e.Status), credentialsWhere)
}

func (e *AuthError) Unwrap() error { return e.Err }

// RegistryError returns err, from a request to registry, as an *AuthError when the registry
// refused it for want of credentials, so that the message says where they are looked up.
func RegistryError(registry string, err error) error {
	var te *transport.Error
	var ae *AuthError
	if err == nil || errors.As(err, &ae) || !errors.As(err, &te) {
		return err
	}
	if te.StatusCode != http.StatusUnauthorized && te.StatusCode != http.StatusForbidden {
		return err
	}
	return &AuthError{Registry: registry, Status: te.StatusCode, Err: err}
}
