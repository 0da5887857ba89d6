package aws

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
)

// credentialSource hands out the credentials a request is signed with.
type credentialSource interface {
	retrieve(ctx context.Context) (awsCredentials, error)
}

const (
	// roleCredentialsEarly is how long before they expire the role's credentials are
	// fetched again (the AWS SDK's expiry window), and roleCredentialsMaxAge how long
	// they are kept at most (the AWS SDK's cap): IMDS rotates them well before they
	// expire.
	roleCredentialsEarly  = 5 * time.Minute
	roleCredentialsMaxAge = time.Hour
)

// roleCredentials are the instance role's temporary credentials, read from IMDS: the
// role's name from meta-data/iam/security-credentials/, then its credentials. They are
// kept until roleCredentialsEarly before they expire, and at most roleCredentialsMaxAge.
type roleCredentials struct {
	imds *imdsClient

	mu               sync.Mutex
	creds            awsCredentials
	renewAt, expires time.Time
}

// retrieve implements credentialSource. When IMDS fails to hand out new credentials, the
// ones kept serve until they expire.
func (r *roleCredentials) retrieve(ctx context.Context) (awsCredentials, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	if r.creds.AccessKeyID != "" && now.Before(r.renewAt) {
		return r.creds, nil
	}
	creds, expires, err := r.read(ctx)
	if err != nil {
		if r.creds.AccessKeyID != "" && now.Before(r.expires) {
			return r.creds, nil
		}
		return awsCredentials{}, fmt.Errorf("instance role credentials: %w", err)
	}
	r.creds, r.expires, r.renewAt = creds, expires, expires.Add(-roleCredentialsEarly)
	if latest := now.Add(roleCredentialsMaxAge); r.renewAt.After(latest) {
		r.renewAt = latest
	}
	return creds, nil
}

// read reads the role's credentials and when they expire from IMDS.
func (r *roleCredentials) read(ctx context.Context) (awsCredentials, time.Time, error) {
	const dir = "iam/security-credentials/"
	list, err := r.imds.metadata(ctx, dir)
	if imdsNotFound(err, metadataPath(dir)) {
		return awsCredentials{}, time.Time{}, errors.New("the instance has no instance role (IMDS " + dir + " is 404)")
	}
	if err != nil {
		return awsCredentials{}, time.Time{}, err
	}
	role, _, _ := bytes.Cut(list, []byte("\n"))
	name := strings.TrimSpace(string(role))
	if name == "" {
		return awsCredentials{}, time.Time{}, errors.New("IMDS names no instance role")
	}
	b, err := r.imds.metadata(ctx, dir+name)
	if err != nil {
		return awsCredentials{}, time.Time{}, fmt.Errorf("role %s: %w", name, err)
	}
	var doc struct {
		Code            string
		Message         string
		AccessKeyID     string `json:"AccessKeyId"`
		SecretAccessKey string
		Token           string
		Expiration      time.Time
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		return awsCredentials{}, time.Time{}, fmt.Errorf("role %s: %w", name, err)
	}
	switch {
	case doc.Code != "Success":
		return awsCredentials{}, time.Time{}, fmt.Errorf("role %s: IMDS answers %s: %s", name, doc.Code, doc.Message)
	case doc.AccessKeyID == "" || doc.SecretAccessKey == "":
		return awsCredentials{}, time.Time{}, fmt.Errorf("role %s: IMDS answers no access key", name)
	}
	return awsCredentials{AccessKeyID: doc.AccessKeyID, SecretAccessKey: doc.SecretAccessKey, SessionToken: doc.Token}, doc.Expiration, nil
}
