package source

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/feature/ec2/imds"

	"github.com/kilnproject/kiln/internal/cloudfake"
	"github.com/kilnproject/kiln/internal/testkit"
)

// hostileAnswer is how much a hostile server offers: eight times the cap. It would stream
// on; it stops there only so that a client without the cap fails this test instead of
// exhausting the machine.
const hostileAnswer = 8 * MaxConfigSize

// streamer answers with hostileAnswer bytes of a config-looking JSON prefix and then
// spaces, chunked (no Content-Length), and counts the requests it streamed and the bytes
// it wrote.
type streamer struct {
	served atomic.Int64
	asked  atomic.Int64
}

func (s *streamer) streamed() *streamer { return s }

func (s *streamer) stream(w http.ResponseWriter) {
	s.asked.Add(1)
	chunk := []byte(strings.Repeat(" ", 1<<20))
	copy(chunk, `{"ignition":{"version":"3.4.0"}`)
	w.WriteHeader(http.StatusOK)
	for s.served.Load() < hostileAnswer {
		n, err := w.Write(chunk)
		s.served.Add(int64(n))
		if err != nil {
			return
		}
	}
}

// hostileIMDS is an IMDSv2 service whose user data, or whose session token, never ends.
type hostileIMDS struct {
	streamer
	cloudfake.IMDS
	streamToken bool
}

func (h *hostileIMDS) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case h.streamToken && r.Method == http.MethodPut:
		w.Header().Set("X-aws-ec2-metadata-token-ttl-seconds", r.Header.Get("X-aws-ec2-metadata-token-ttl-seconds"))
		h.stream(w)
	case !h.streamToken && r.Method == http.MethodGet && r.URL.Path == "/latest/user-data":
		h.stream(w)
	default:
		h.IMDS.ServeHTTP(w, r)
	}
}

// hostileGCE is a Google metadata server whose user-data attribute never ends.
type hostileGCE struct {
	streamer
	cloudfake.GCEMetadata
}

func (h *hostileGCE) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/computeMetadata/v1/instance/attributes/"+GCEUserDataAttribute {
		w.Header().Set("Metadata-Flavor", "Google")
		h.stream(w)
		return
	}
	h.GCEMetadata.ServeHTTP(w, r)
}

// hostileURL is a web server whose config never ends.
type hostileURL struct{ streamer }

func (h *hostileURL) ServeHTTP(w http.ResponseWriter, _ *http.Request) { h.stream(w) }

// TestAttackEndlessAnswer: a metadata service or config server that answers far more
// than MaxConfigSize makes the source fail, naming the source and the cap, after reading
// no more than the cap: the client stops taking bytes and the heap does not grow with
// the answer.
func TestAttackEndlessAnswer(t *testing.T) {
	type server interface {
		http.Handler
		streamed() *streamer
	}
	tests := []struct {
		name     string
		handler  server
		provider func(srv *httptest.Server) Provider
		// direct: call Fetch rather than Select (a token that never ends makes Probe
		// say no, so Select would just skip the source).
		direct  bool
		wantErr []string
	}{
		{
			name:    "aws user data",
			handler: &hostileIMDS{IMDS: cloudfake.IMDS{InstanceID: testInstanceID}},
			provider: func(srv *httptest.Server) Provider {
				return &AWS{Endpoint: srv.URL, ProbeTimeout: time.Minute}
			},
			wantErr: []string{"config source aws-imds", "imds user-data", "64 MiB cap"},
		},
		{
			name:    "aws session token",
			handler: &hostileIMDS{IMDS: cloudfake.IMDS{InstanceID: testInstanceID}, streamToken: true},
			provider: func(srv *httptest.Server) Provider {
				return &AWS{Endpoint: srv.URL, ProbeTimeout: time.Minute}
			},
			direct:  true,
			wantErr: []string{"imds user-data", "64 MiB cap"},
		},
		{
			name:    "gce user data",
			handler: &hostileGCE{GCEMetadata: cloudfake.GCEMetadata{ID: testGCEID}},
			provider: func(srv *httptest.Server) Provider {
				return &GCE{Host: srv.Listener.Addr().String(), ProbeTimeout: time.Minute}
			},
			wantErr: []string{"config source gce-metadata", "instance/attributes/user-data", "64 MiB cap"},
		},
		{
			name:    "kiln.config.url",
			handler: &hostileURL{},
			provider: func(srv *httptest.Server) Provider {
				return &CmdlineURL{Cmdline: "kiln.config.url=" + srv.URL + "/node.ign", Backoff: time.Millisecond}
			},
			wantErr: []string{"config source cmdline-url", "/node.ign", "64 MiB cap"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(tc.handler)
			defer srv.Close()
			p := tc.provider(srv)

			before := testkit.HeapAllocated()
			var err error
			if tc.direct {
				_, err = p.Fetch(context.Background())
			} else {
				_, _, err = Select(context.Background(), []Provider{p}, 5*time.Minute)
			}
			grown := testkit.HeapAllocated() - before

			if err == nil {
				t.Fatal("a never-ending answer was accepted")
			}
			for _, want := range tc.wantErr {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not contain %q", err, want)
				}
			}
			checkStopped(t, tc.handler.streamed(), grown)
		})
	}
}

// TestAttackEndlessLookup: the metadata clients that first boot uses for its other
// lookups (the etcd volume's instance id and zone, the DNS provider's project) stop at
// the cap too.
func TestAttackEndlessLookup(t *testing.T) {
	tests := []struct {
		name    string
		handler http.Handler
		stream  *streamer
		lookup  func(ctx context.Context, srv *httptest.Server) error
	}{
		{name: "imds instance-id", lookup: func(ctx context.Context, srv *httptest.Server) error {
			md := imds.New(imds.Options{Endpoint: srv.URL, HTTPClient: CapIMDS(nil)})
			out, err := md.GetMetadata(ctx, &imds.GetMetadataInput{Path: "instance-id"})
			if err == nil {
				out.Content.Close()
			}
			return err
		}},
		{name: "imds region for the node's AWS calls", lookup: func(ctx context.Context, srv *httptest.Server) error {
			awsEnv(t, srv, "")
			_, err := AWSConfig(ctx, "")
			return err
		}},
		{name: "imds region from node.yaml's aws.endpoints.imds", lookup: func(ctx context.Context, srv *httptest.Server) error {
			awsEnv(t, srv, "")
			t.Setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", "http://127.0.0.1:1") // not asked: the endpoint given wins
			_, err := AWSConfig(ctx, srv.URL)
			return err
		}},
		{name: "imds instance-role credentials for the node's AWS calls", lookup: func(ctx context.Context, srv *httptest.Server) error {
			awsEnv(t, srv, "eu-west-1") // the region from the environment: only the credentials come from IMDS
			cfg, err := AWSConfig(ctx, "")
			if err != nil {
				return err
			}
			_, err = cfg.Credentials.Retrieve(ctx)
			return err
		}},
		{name: "gce instance name", lookup: func(ctx context.Context, srv *httptest.Server) error {
			t.Setenv("GCE_METADATA_HOST", srv.Listener.Addr().String())
			_, err := GCEMetadataClient().InstanceNameWithContext(ctx)
			return err
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := &hostileLookup{}
			srv := httptest.NewServer(h)
			defer srv.Close()
			before := testkit.HeapAllocated()
			err := tc.lookup(context.Background(), srv)
			grown := testkit.HeapAllocated() - before
			if err == nil || !strings.Contains(err.Error(), "64 MiB cap") {
				t.Fatalf("lookup error = %v; want the 64 MiB cap", err)
			}
			checkStopped(t, &h.streamer, grown)
		})
	}
}

// checkStopped fails t unless the client stopped at the cap: it asked for the endless
// answer once (an answer over the cap is not asked for again), the server wrote no more
// of it than the cap and what socket buffers hold ahead of the client, and reading it
// allocated about twice the cap at most.
func checkStopped(t *testing.T, s *streamer, grown uint64) {
	t.Helper()
	if asked := s.asked.Load(); asked != 1 {
		t.Errorf("the client asked for the endless answer %d times, want once", asked)
	}
	if taken, slack := s.served.Load(), bufferSlack(); taken > MaxConfigSize+slack {
		t.Errorf("the client took %d MiB of the answer; the cap is %d MiB and buffers hold at most %d MiB more",
			taken>>20, MaxConfigSize>>20, slack>>20)
	}
	// Reading up to the cap into a growing buffer allocates about twice the cap.
	if limit := uint64(4 * MaxConfigSize); grown > limit {
		t.Errorf("reading the answer allocated %d MiB, want at most %d MiB", grown>>20, limit>>20)
	}
}

// bufferSlack is how much of an answer can have been written by the server and not yet
// taken by the client when the client stops: what the kernel lets one TCP connection
// buffer (the receive buffer autotunes up to tcp_rmem's maximum, the send buffer up to
// tcp_wmem's), and 1 MiB for the HTTP server's and client's own buffers and the write
// under way. Where those limits cannot be read it is 32 MiB.
func bufferSlack() int64 {
	slack := int64(1 << 20)
	for _, name := range []string{"/proc/sys/net/ipv4/tcp_rmem", "/proc/sys/net/ipv4/tcp_wmem"} {
		b, _ := os.ReadFile(name)
		fields := strings.Fields(string(b)) // min, default, max
		if len(fields) != 3 {
			return 32 << 20
		}
		n, err := strconv.ParseInt(fields[2], 10, 64)
		if err != nil {
			return 32 << 20
		}
		slack += n
	}
	return slack
}

// awsEnv points the SDK's default configuration at srv as its IMDS, with no other source of
// credentials, and region as its region ("" for none).
func awsEnv(t *testing.T, srv *httptest.Server, region string) {
	t.Helper()
	dir := t.TempDir()
	for k, v := range map[string]string{
		"AWS_EC2_METADATA_SERVICE_ENDPOINT": srv.URL, "AWS_REGION": region, "AWS_DEFAULT_REGION": "",
		"AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": "", "AWS_SESSION_TOKEN": "", "AWS_PROFILE": "",
		"AWS_CONFIG_FILE": filepath.Join(dir, "config"), "AWS_SHARED_CREDENTIALS_FILE": filepath.Join(dir, "credentials"),
		"AWS_CONTAINER_CREDENTIALS_FULL_URI": "", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI": "", "AWS_WEB_IDENTITY_TOKEN_FILE": "",
	} {
		t.Setenv(k, v)
	}
}

// hostileLookup is a metadata server (IMDSv2 or Google) whose every metadata answer
// never ends.
type hostileLookup struct {
	streamer
	cloudfake.IMDS
}

func (h *hostileLookup) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.Method == http.MethodPut:
		h.IMDS.ServeHTTP(w, r) // the session token
	default:
		w.Header().Set("Metadata-Flavor", "Google")
		h.stream(w)
	}
}

// TestAttackHugeFile: a file source (embedded file, fw_cfg item) of gigabytes is refused
// naming the file and the cap.
func TestAttackHugeFile(t *testing.T) {
	huge := func(t *testing.T, path string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		f, err := os.Create(path)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if err := f.Truncate(4 << 30); err != nil { // sparse: 4 GiB of zeros
			t.Fatal(err)
		}
	}
	tests := []struct {
		name    string
		setup   func(t *testing.T) (Provider, string)
		wantErr string
	}{
		{name: "embedded", setup: func(t *testing.T) (Provider, string) {
			p := filepath.Join(t.TempDir(), "config.ign")
			huge(t, p)
			return Embedded{Path: p}, p
		}, wantErr: "config source embedded"},
		{name: "fw_cfg", setup: func(t *testing.T) (Provider, string) {
			f := &FWCfg{Sysfs: t.TempDir(), LoadModule: func(context.Context) error { return nil }}
			huge(t, f.RawPath())
			return f, f.RawPath()
		}, wantErr: "config source fw_cfg"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, path := tc.setup(t)
			before := testkit.HeapAllocated()
			_, _, err := Select(context.Background(), []Provider{p}, 5*time.Minute)
			grown := testkit.HeapAllocated() - before
			if err == nil {
				t.Fatal("a 4 GiB config file was accepted")
			}
			for _, want := range []string{tc.wantErr, path, "64 MiB cap"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not contain %q", err, want)
				}
			}
			if limit := uint64(4 * MaxConfigSize); grown > limit {
				t.Errorf("reading the file allocated %d MiB, want at most %d MiB", grown>>20, limit>>20)
			}
		})
	}
}
