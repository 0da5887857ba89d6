package aws

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"
)

// pagedEC2 answers DescribeVolumes with one volume a page, the ids in pages, each page
// naming the next by its token page-N; stuck, every page names page-0.
type pagedEC2 struct {
	pages  []string
	stuck  bool
	tokens []string // the NextToken of each request
}

func (p *pagedEC2) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	r.ParseForm()
	tok := r.PostForm.Get("NextToken")
	p.tokens = append(p.tokens, tok)
	i := 0
	if tok != "" {
		fmt.Sscanf(tok, "page-%d", &i)
	}
	next := ""
	if i+1 < len(p.pages) {
		next = fmt.Sprintf("<nextToken>page-%d</nextToken>", i+1)
	}
	if p.stuck {
		next = "<nextToken>page-0</nextToken>"
	}
	fmt.Fprintf(w, `<DescribeVolumesResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/"><volumeSet><item><volumeId>%s</volumeId></item></volumeSet>%s</DescribeVolumesResponse>`, p.pages[i], next)
}

// TestDescribeVolumesPages: DescribeVolumes reads every page, asking for each with the
// token of the one before, and stops on a token that does not move on.
func TestDescribeVolumesPages(t *testing.T) {
	for _, tc := range []struct {
		name       string
		p          *pagedEC2
		wantTokens []string
		wantErr    string
	}{
		{name: "one page", p: &pagedEC2{pages: []string{"vol-1"}}, wantTokens: []string{""}},
		{name: "three pages", p: &pagedEC2{pages: []string{"vol-1", "vol-2", "vol-3"}}, wantTokens: []string{"", "page-1", "page-2"}},
		{name: "stuck", p: &pagedEC2{pages: []string{"vol-1"}, stuck: true}, wantTokens: []string{"", "page-0"},
			wantErr: "the next page's token is the page's own"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(tc.p)
			defer srv.Close()
			c, err := newEC2Client(srv.URL, testRegion, staticCredentials{AccessKeyID: testAKID, SecretAccessKey: testSecret})
			if err != nil {
				t.Fatal(err)
			}
			vols, err := c.DescribeVolumes(context.Background(), nil, []Filter{{Name: "tag-key", Values: []string{"k"}}})
			if !slices.Equal(tc.p.tokens, tc.wantTokens) {
				t.Errorf("tokens %q, want %q", tc.p.tokens, tc.wantTokens)
			}
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Errorf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			var ids []string
			for _, v := range vols {
				ids = append(ids, v.ID)
			}
			if err != nil || !slices.Equal(ids, tc.p.pages) {
				t.Errorf("volumes %q, %v; want %q", ids, err, tc.p.pages)
			}
		})
	}
}

// TestEC2Params: the Query API's parameters of each call, as EC2 documents them.
func TestEC2Params(t *testing.T) {
	var forms []url.Values
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.ParseForm()
		forms = append(forms, r.PostForm)
		fmt.Fprint(w, "<R/>")
	}))
	defer srv.Close()
	c, err := newEC2Client(srv.URL, testRegion, staticCredentials{AccessKeyID: testAKID, SecretAccessKey: testSecret})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	c.DescribeVolumes(ctx, []string{"vol-1", "vol-2"}, []Filter{{Name: "availability-zone", Values: []string{"eu-west-1a"}}, {Name: "tag:a b", Values: []string{"x", "y=z"}}})
	c.AttachVolume(ctx, "vol-1", "i-1", "/dev/xvdu")
	want := []url.Values{
		{"Action": {"DescribeVolumes"}, "Version": {"2016-11-15"}, "VolumeId.1": {"vol-1"}, "VolumeId.2": {"vol-2"},
			"Filter.1.Name": {"availability-zone"}, "Filter.1.Value.1": {"eu-west-1a"},
			"Filter.2.Name": {"tag:a b"}, "Filter.2.Value.1": {"x"}, "Filter.2.Value.2": {"y=z"}},
		{"Action": {"AttachVolume"}, "Version": {"2016-11-15"}, "VolumeId": {"vol-1"}, "InstanceId": {"i-1"}, "Device": {"/dev/xvdu"}},
	}
	if fmt.Sprint(forms) != fmt.Sprint(want) {
		t.Errorf("forms\n got  %v\n want %v", forms, want)
	}
}
