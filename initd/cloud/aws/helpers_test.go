package aws

import "context"

// staticCredentials are fixed credentials, as the tests sign with.
type staticCredentials awsCredentials

func (s staticCredentials) retrieve(context.Context) (awsCredentials, error) {
	return awsCredentials(s), nil
}
