package qemutests

import (
	"fmt"
	"net/http"

	"github.com/kilnproject/kiln/internal/cloudfake"
)

// roleCreds are the temporary credentials of the instance role: the IMDS fake hands them
// out, the EC2 and Route 53 fakes accept requests signed with them and nothing else.
type roleCreds struct{ key, secret, token string }

// checkSigV4 checks r as AWS does (cloudfake.CheckSigV4) with the instance role's
// credentials c, for service, and returns the region it was signed for.
func checkSigV4(r *http.Request, body []byte, c roleCreds, service string) (string, error) {
	scope, err := cloudfake.CheckSigV4(r, body, cloudfake.AWSCredentials{AccessKeyID: c.key, SecretAccessKey: c.secret, SessionToken: c.token})
	if err != nil {
		return "", err
	}
	if scope.Service != service {
		return "", fmt.Errorf("signed for service %s, not %s", scope.Service, service)
	}
	return scope.Region, nil
}
