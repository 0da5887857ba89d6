package cmdline

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	tests := []struct {
		name   string
		in     string
		params []Param
		init   []string
	}{
		{"empty", "", nil, nil},
		{"only space", " \t\r\n", nil, nil},
		{"key value and flag", "root=PARTUUID=ab ro\n",
			[]Param{{"root", "PARTUUID=ab", true}, {"ro", "", false}}, nil},
		{"empty value", "kiln.config.url= ro",
			[]Param{{"kiln.config.url", "", true}, {"ro", "", false}}, nil},
		{"quoted value", `kiln.note="a b  c" quiet`,
			[]Param{{"kiln.note", "a b  c", true}, {"quiet", "", false}}, nil},
		{"quoted whole param", `"kiln.note=a b" quiet`,
			[]Param{{"kiln.note", "a b", true}, {"quiet", "", false}}, nil},
		{"equals inside a quoted value", `k="a=b c=d"`, []Param{{"k", "a=b c=d", true}}, nil},
		{"carriage return, tab, newline separate", "a=1\r\nb=2\tc=3\r",
			[]Param{{"a", "1", true}, {"b", "2", true}, {"c", "3", true}}, nil},
		{"vertical tab and form feed separate", "a=1\vb=2\fc",
			[]Param{{"a", "1", true}, {"b", "2", true}, {"c", "", false}}, nil},
		{"quotes keep a carriage return", "k=\"a\rb\"", []Param{{"k", "a\rb", true}}, nil},
		{"unterminated quote runs to the end", `k="a b`, []Param{{"k", "a b", true}}, nil},
		{"empty quotes are an empty word", `"" k`, []Param{{"", "", false}, {"k", "", false}}, nil},
		{"repeated keys are all kept", "k=1 k=2",
			[]Param{{"k", "1", true}, {"k", "2", true}}, nil},
		{"after -- belongs to init", "ro -- kiln.platform=aws single",
			[]Param{{"ro", "", false}}, []string{"kiln.platform=aws", "single"}},
		{"-- with a value is a parameter", "--=x", []Param{{"--", "x", true}}, nil},
		{"unicode", "k=é→", []Param{{"k", "é→", true}}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := Parse(tt.in)
			if !reflect.DeepEqual(l.Params, tt.params) {
				t.Errorf("Params = %#v, want %#v", l.Params, tt.params)
			}
			if !reflect.DeepEqual(l.Init, tt.init) {
				t.Errorf("Init = %#v, want %#v", l.Init, tt.init)
			}
		})
	}
}

func TestLookupAndValues(t *testing.T) {
	tests := []struct {
		name, line, key string
		want            string
		wantOK          bool
		all             []string
	}{
		{"present", "root=PARTUUID=x ro kiln.config.url=http://h/c.ign console=ttyS0", "kiln.config.url", "http://h/c.ign", true, []string{"http://h/c.ign"}},
		{"absent", "root=PARTUUID=x ro", "kiln.config.url", "", false, nil},
		{"prefix of another key", "kiln.config.url.bak=x", "kiln.config.url", "", false, nil},
		{"quoted", `kiln.config.url="http://h/a b.ign" quiet`, "kiln.config.url", "http://h/a b.ign", true, []string{"http://h/a b.ign"}},
		{"last wins, all listed", "console=tty0 console=ttyS0,115200\r\n", "console", "ttyS0,115200", true, []string{"tty0", "ttyS0,115200"}},
		{"last wins", "kiln.config.timeout=10 kiln.config.timeout=20\n", "kiln.config.timeout", "20", true, []string{"10", "20"}},
		{"empty value", "kiln.config.url= ro", "kiln.config.url", "", true, []string{""}},
		{"flag", "ro quiet", "quiet", "", true, []string{""}},
		{"not searched after --", "ro -- kiln.config.url=http://h/", "kiln.config.url", "", false, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := Parse(tt.line)
			got, ok := l.Lookup(tt.key)
			if got != tt.want || ok != tt.wantOK {
				t.Errorf("Lookup(%q) = %q, %v; want %q, %v", tt.key, got, ok, tt.want, tt.wantOK)
			}
			if all := l.Values(tt.key); !reflect.DeepEqual(all, tt.all) {
				t.Errorf("Values(%q) = %q, want %q", tt.key, all, tt.all)
			}
		})
	}
}

func TestRaw(t *testing.T) {
	if got := Parse("  ro quiet\n").Raw; got != "ro quiet" {
		t.Errorf("Raw = %q", got)
	}
}

func TestRead(t *testing.T) {
	file := filepath.Join(t.TempDir(), "cmdline")
	if err := os.WriteFile(file, []byte("kiln.platform=qemu ro\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	l, err := Read(file)
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := l.Lookup("kiln.platform"); v != "qemu" {
		t.Errorf("kiln.platform = %q", v)
	}
	if _, err := Read(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("Read of a missing file: no error")
	}
}

func TestDuration(t *testing.T) {
	tests := []struct {
		in      string
		want    time.Duration
		wantErr bool
	}{
		{"90", 90 * time.Second, false},
		{"0", 0, false},
		{"90s", 90 * time.Second, false},
		{"1m30s", 90 * time.Second, false},
		{"soon", 0, true},
		{"", 0, true},
		{"-5s", 0, true},
		{"-5", 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := Duration(tt.in)
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Errorf("Duration(%q) = %v, %v; want %v, error %v", tt.in, got, err, tt.want, tt.wantErr)
			}
		})
	}
}
