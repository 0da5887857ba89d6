package aws

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestDecodeErrors: EC2's and Route 53's error answers give the code, message and request
// id, and the error names the call and the code.
func TestDecodeErrors(t *testing.T) {
	tests := []struct {
		name    string
		decode  errorDecoder
		status  int
		body    string
		want    APIError
		wantMsg string
	}{
		{name: "EC2", decode: decodeEC2Error, status: 400,
			body:    `<?xml version="1.0" encoding="UTF-8"?><Response><Errors><Error><Code>IncorrectState</Code><Message>vol 'vol-0b' is not 'available'.</Message></Error></Errors><RequestID>r-1</RequestID></Response>`,
			want:    APIError{Code: "IncorrectState", Message: "vol 'vol-0b' is not 'available'.", RequestID: "r-1"},
			wantMsg: "EC2 AttachVolume: IncorrectState: vol 'vol-0b' is not 'available'. (HTTP 400, request r-1)"},
		{name: "EC2 with escaped text and no request id", decode: decodeEC2Error, status: 400,
			body:    `<Response><Errors><Error><Code>InvalidParameterValue</Code><Message>Invalid value &apos;/dev/xvdu&apos; for unixDevice. Attachment point /dev/xvdu is already in use</Message></Error></Errors></Response>`,
			want:    APIError{Code: "InvalidParameterValue", Message: "Invalid value '/dev/xvdu' for unixDevice. Attachment point /dev/xvdu is already in use"},
			wantMsg: "EC2 AttachVolume: InvalidParameterValue: Invalid value '/dev/xvdu' for unixDevice. Attachment point /dev/xvdu is already in use (HTTP 400)"},
		{name: "Route 53", decode: decodeRoute53Error, status: 404,
			body:    `<?xml version="1.0"?><ErrorResponse xmlns="https://route53.amazonaws.com/doc/2013-04-01/"><Error><Type>Sender</Type><Code>NoSuchHostedZone</Code><Message>No hosted zone found with ID: ZNOPE</Message></Error><RequestId>r-2</RequestId></ErrorResponse>`,
			want:    APIError{Code: "NoSuchHostedZone", Message: "No hosted zone found with ID: ZNOPE", RequestID: "r-2"},
			wantMsg: "Route 53 AttachVolume: NoSuchHostedZone: No hosted zone found with ID: ZNOPE (HTTP 404, request r-2)"},
		{name: "Route 53 refused change batch", decode: decodeRoute53Error, status: 400,
			body: `<?xml version="1.0"?><InvalidChangeBatch xmlns="https://route53.amazonaws.com/doc/2013-04-01/"><Messages><Message>Tried to delete resource record set [name='a.example.test.', type='A'] but the values provided do not match the current values</Message><Message>second</Message></Messages><RequestId>r-3</RequestId></InvalidChangeBatch>`,
			want: APIError{Code: "InvalidChangeBatch", RequestID: "r-3",
				Message: "Tried to delete resource record set [name='a.example.test.', type='A'] but the values provided do not match the current values; second"}},
		{name: "Route 53 throttled", decode: decodeRoute53Error, status: 400,
			body: `<ErrorResponse><Error><Type>Sender</Type><Code>Throttling</Code><Message>Rate exceeded</Message></Error><RequestId>r-4</RequestId></ErrorResponse>`,
			want: APIError{Code: "Throttling", Message: "Rate exceeded", RequestID: "r-4"}},
		{name: "a proxy's page", decode: decodeEC2Error, status: 502,
			body:    "<html>\n<body>Bad   gateway</body></html>",
			want:    APIError{Message: "<html> <body>Bad gateway</body></html>"},
			wantMsg: "EC2 AttachVolume: HTTP 502 Bad Gateway: <html> <body>Bad gateway</body></html>"},
		{name: "no body", decode: decodeRoute53Error, status: 503,
			wantMsg: "Route 53 AttachVolume: HTTP 503 Service Unavailable"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			service := "EC2"
			if strings.HasPrefix(tc.name, "Route 53") || tc.name == "no body" {
				service = "Route 53"
			}
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(tc.status)
				fmt.Fprint(w, tc.body)
			}))
			defer srv.Close()
			c := testAPIClient(t, service, srv.URL, tc.decode)
			_, err := c.do(context.Background(), apiRequest{op: "AttachVolume", method: http.MethodPost, path: "/"})
			var ae *APIError
			if !errors.As(err, &ae) {
				t.Fatalf("err = %v, not an *APIError", err)
			}
			want := tc.want
			want.Service, want.Op, want.StatusCode = service, "AttachVolume", tc.status
			if *ae != want {
				t.Errorf("error = %+v\n want %+v", *ae, want)
			}
			if tc.wantMsg != "" && err.Error() != tc.wantMsg {
				t.Errorf("message %q\n want %q", err, tc.wantMsg)
			}
		})
	}
}

// testAPIClient is a client of the API at endpoint, with the test key and short pauses
// between attempts.
func testAPIClient(t *testing.T, service, endpoint string, decode errorDecoder) *apiClient {
	t.Helper()
	c, err := newAPIClient(service, "ec2", testRegion, endpoint, staticCredentials{AccessKeyID: testAKID, SecretAccessKey: testSecret}, decode)
	if err != nil {
		t.Fatal(err)
	}
	c.pause, c.throttledPause = time.Millisecond, 2*time.Millisecond
	return c
}

// flaky answers the first len(fails) requests with those answers (status and EC2 error
// code, "" for a body that is not AWS's, "drop" to close the connection unanswered), then 200.
type flaky struct {
	fails []string

	mu    sync.Mutex
	dates []string // the X-Amz-Date of each request
	paths []string
}

func (f *flaky) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	n := len(f.dates)
	f.dates = append(f.dates, r.Header.Get("X-Amz-Date")+" "+r.Header.Get("Authorization"))
	f.paths = append(f.paths, r.URL.Path)
	f.mu.Unlock()
	if n >= len(f.fails) {
		fmt.Fprint(w, "<DescribeVolumesResponse/>")
		return
	}
	status, code, _ := strings.Cut(f.fails[n], " ")
	if status == "drop" {
		conn, _, _ := w.(http.Hijacker).Hijack()
		conn.Close()
		return
	}
	var s int
	fmt.Sscan(status, &s)
	w.WriteHeader(s)
	if code != "" {
		fmt.Fprintf(w, "<Response><Errors><Error><Code>%s</Code><Message>m</Message></Error></Errors></Response>", code)
	}
}

func (f *flaky) requests() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.dates)
}

// TestAPIRetries: throttling, server errors and lost answers are tried again, up to
// apiAttempts, each attempt signed anew; other errors are not.
func TestAPIRetries(t *testing.T) {
	tests := []struct {
		name      string
		fails     []string
		wantCalls int
		wantCode  string // the error's code; "" for success
		wantErr   string
	}{
		{name: "success at once", wantCalls: 1},
		{name: "a 503 then success", fails: []string{"503"}, wantCalls: 2},
		{name: "EC2 throttling then success", fails: []string{"503 RequestLimitExceeded"}, wantCalls: 2},
		{name: "Route 53 throttling then success", fails: []string{"400 Throttling", "400 PriorRequestNotComplete"}, wantCalls: 3},
		{name: "429 then success", fails: []string{"429"}, wantCalls: 2},
		{name: "a dropped connection then success", fails: []string{"drop"}, wantCalls: 2},
		{name: "server errors throughout", fails: []string{"500 InternalError", "502", "500 InternalError", "500"}, wantCalls: apiAttempts,
			wantCode: "InternalError"},
		{name: "dropped throughout", fails: []string{"drop", "drop", "drop", "drop"}, wantCalls: apiAttempts, wantErr: "EC2 DescribeVolumes: no answer"},
		{name: "refused credentials are not tried again", fails: []string{"401 AuthFailure"}, wantCalls: 1, wantCode: "AuthFailure"},
		{name: "a state error is not tried again", fails: []string{"400 IncorrectState"}, wantCalls: 1, wantCode: "IncorrectState"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := &flaky{fails: tc.fails}
			srv := httptest.NewServer(f)
			defer srv.Close()
			c := testAPIClient(t, "EC2", srv.URL, decodeEC2Error)
			_, err := c.do(context.Background(), apiRequest{op: "DescribeVolumes", method: http.MethodPost, path: "/", body: []byte("Action=DescribeVolumes")})
			if n := f.requests(); n != tc.wantCalls {
				t.Errorf("%d requests, want %d", n, tc.wantCalls)
			}
			var ae *APIError
			switch {
			case tc.wantCode == "" && tc.wantErr == "" && err != nil:
				t.Errorf("err = %v", err)
			case tc.wantCode != "" && (!errors.As(err, &ae) || ae.Code != tc.wantCode):
				t.Errorf("err = %v, want code %s", err, tc.wantCode)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Errorf("err = %v, want %q", err, tc.wantErr)
			}
			f.mu.Lock()
			defer f.mu.Unlock()
			for _, d := range f.dates {
				if !strings.Contains(d, "Signature=") {
					t.Errorf("an attempt was not signed: %q", d)
				}
			}
		})
	}
}

// TestAPIRetryStopsWithContext: a context that ends stops the attempts.
func TestAPIRetryStopsWithContext(t *testing.T) {
	f := &flaky{fails: []string{"400 Throttling", "400 Throttling", "400 Throttling"}}
	srv := httptest.NewServer(f)
	defer srv.Close()
	c := testAPIClient(t, "EC2", srv.URL, decodeEC2Error)
	c.throttledPause = time.Hour
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := c.do(ctx, apiRequest{op: "DescribeVolumes", method: http.MethodPost, path: "/"})
	var ae *APIError
	if !errors.As(err, &ae) || ae.Code != "Throttling" || !errors.Is(err, context.DeadlineExceeded) || f.requests() != 1 {
		t.Errorf("err = %v after %d requests; want the throttling and the deadline after 1", err, f.requests())
	}
}

// TestAPIEndpointPath: an endpoint with a path (a proxy's) prefixes the calls' paths.
func TestAPIEndpointPath(t *testing.T) {
	for _, tc := range []struct{ endpoint, path, want string }{
		{"", "/", "/"},
		{"/", "/", "/"},
		{"/aws/ec2/", "/", "/aws/ec2/"},
		{"/r53", "/2013-04-01/change/C%2F1", "/r53/2013-04-01/change/C/1"},
	} {
		f := &flaky{}
		srv := httptest.NewServer(f)
		c := testAPIClient(t, "EC2", srv.URL+tc.endpoint, decodeEC2Error)
		_, err := c.do(context.Background(), apiRequest{op: "DescribeVolumes", method: http.MethodGet, path: tc.path})
		srv.Close()
		if err != nil || len(f.paths) != 1 || f.paths[0] != tc.want {
			t.Errorf("endpoint path %q, call %q: requested %q, %v; want %q", tc.endpoint, tc.path, f.paths, err, tc.want)
		}
	}
}

// TestEndpoints: the default endpoints of the partitions, and the region Route 53 is
// signed for.
func TestEndpoints(t *testing.T) {
	for _, tc := range []struct{ region, ec2, route53, route53Region string }{
		{"eu-west-1", "https://ec2.eu-west-1.amazonaws.com", "https://route53.amazonaws.com", "us-east-1"},
		{"us-east-1", "https://ec2.us-east-1.amazonaws.com", "https://route53.amazonaws.com", "us-east-1"},
		{"cn-north-1", "https://ec2.cn-north-1.amazonaws.com.cn", "https://route53.amazonaws.com.cn", "cn-northwest-1"},
		{"us-gov-west-1", "https://ec2.us-gov-west-1.amazonaws.com", "https://route53.us-gov.amazonaws.com", "us-gov-west-1"},
	} {
		e, r := route53Endpoint(tc.region)
		if got := ec2Endpoint(tc.region); got != tc.ec2 || e != tc.route53 || r != tc.route53Region {
			t.Errorf("%s: EC2 %s, Route 53 %s signed for %s; want %s, %s, %s", tc.region, got, e, r, tc.ec2, tc.route53, tc.route53Region)
		}
	}
}

func TestNewAPIClientRefusesEndpoints(t *testing.T) {
	for _, e := range []string{"", "ec2.eu-west-1.amazonaws.com", "ftp://host/", "https://", "://x"} {
		if _, err := newEC2Client(e, testRegion, staticCredentials{}); err == nil {
			t.Errorf("endpoint %q accepted", e)
		}
	}
}
