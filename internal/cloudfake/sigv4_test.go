package cloudfake

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
)

// TestCheckSigV4 signs requests with the SDK's signer and checks that what AWS accepts is
// accepted and what it refuses is refused, for the reason AWS would give.
func TestCheckSigV4(t *testing.T) {
	good := AWSCredentials{AccessKeyID: "AKIDKILN", SecretAccessKey: "secret", SessionToken: "token"}
	body := "Action=DescribeVolumes&Version=2016-11-15"
	tests := []struct {
		name    string
		signer  AWSCredentials
		when    time.Time
		tamper  func(r *http.Request) string // returns the body the fake sees
		wantErr string
		creds   bool // a *CredentialsError
	}{
		{name: "signed right", signer: good},
		{name: "another key", signer: AWSCredentials{AccessKeyID: "AKIDOTHER", SecretAccessKey: "secret", SessionToken: "token"},
			wantErr: "access key AKIDOTHER", creds: true},
		{name: "another secret", signer: AWSCredentials{AccessKeyID: "AKIDKILN", SecretAccessKey: "guess", SessionToken: "token"},
			wantErr: "signature does not match", creds: true},
		{name: "no session token", signer: AWSCredentials{AccessKeyID: "AKIDKILN", SecretAccessKey: "secret"},
			wantErr: "X-Amz-Security-Token", creds: true},
		{name: "body changed after signing", signer: good,
			tamper: func(*http.Request) string { return body + "&VolumeId.1=vol-other" }, wantErr: "signature does not match", creds: true},
		{name: "signed an hour ago", signer: good, when: time.Now().Add(-time.Hour), wantErr: "AWS allows 15 minutes"},
		{name: "not SigV4", signer: good, tamper: func(r *http.Request) string { r.Header.Set("Authorization", "Bearer x"); return body },
			wantErr: "is not SigV4"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, _ := http.NewRequest(http.MethodPost, "http://127.0.0.1:1/", strings.NewReader(body))
			r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			sum := sha256.Sum256([]byte(body))
			when := tt.when
			if when.IsZero() {
				when = time.Now()
			}
			c := aws.Credentials{AccessKeyID: tt.signer.AccessKeyID, SecretAccessKey: tt.signer.SecretAccessKey, SessionToken: tt.signer.SessionToken}
			if err := v4.NewSigner().SignHTTP(context.Background(), c, r, hex.EncodeToString(sum[:]), "ec2", "eu-west-1", when); err != nil {
				t.Fatal(err)
			}
			seen := body
			if tt.tamper != nil {
				seen = tt.tamper(r)
			}
			scope, err := CheckSigV4(r, []byte(seen), good)
			if tt.wantErr == "" {
				if err != nil || scope != (SigV4Scope{AccessKeyID: "AKIDKILN", Region: "eu-west-1", Service: "ec2"}) {
					t.Fatalf("CheckSigV4 = %+v, %v", scope, err)
				}
				return
			}
			var ce *CredentialsError
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) || errors.As(err, &ce) != tt.creds {
				t.Errorf("CheckSigV4 = %v; want an error naming %q (credentials error: %v)", err, tt.wantErr, tt.creds)
			}
		})
	}
}
