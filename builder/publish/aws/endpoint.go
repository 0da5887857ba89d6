package aws

import (
	"context"
	"fmt"

	"github.com/aws/smithy-go/middleware"
	smithyhttp "github.com/aws/smithy-go/transport/http"
)

// A PlainHTTPError is a call kiln did not send: its endpoint is not https, and the request's
// SigV4 signature and session token would have gone in clear text.
type PlainHTTPError struct{ Endpoint string }

func (e *PlainHTTPError) Error() string {
	return fmt.Sprintf("refusing to send AWS credentials to %s in clear text: use an https endpoint (for an emulator on http, --insecure-http)", e.Endpoint)
}

// refusePlainHTTP fails a call whose endpoint is not https before it is signed, wherever the
// endpoint came from (Config.Endpoint, AWS_ENDPOINT_URL_*, the shared config). Its error is
// not retried.
type refusePlainHTTP struct{}

func (refusePlainHTTP) ID() string { return "KilnRefusePlainHTTP" }

func (refusePlainHTTP) HandleFinalize(ctx context.Context, in middleware.FinalizeInput, next middleware.FinalizeHandler) (middleware.FinalizeOutput, middleware.Metadata, error) {
	if req, ok := in.Request.(*smithyhttp.Request); ok && req.URL.Scheme != "https" {
		return middleware.FinalizeOutput{}, middleware.Metadata{}, &PlainHTTPError{Endpoint: req.URL.Scheme + "://" + req.URL.Host}
	}
	return next.HandleFinalize(ctx, in)
}

// addRefusePlainHTTP puts refusePlainHTTP into a client's stack, after the endpoint is
// resolved and before the request is signed.
func addRefusePlainHTTP(stack *middleware.Stack) error {
	return stack.Finalize.Insert(refusePlainHTTP{}, "Signing", middleware.Before)
}
