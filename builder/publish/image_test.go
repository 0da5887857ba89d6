package publish

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kilnproject/kiln/builder/publish/publishtest"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

// Load finds the output's entry in the sidecar metadata, and refuses a file that is not
// the one the bake wrote or metadata without a digest.
func TestLoad(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(t *testing.T, dir string, md *nodeimage.Metadata) string // returns the path to load
		want string                                                        // error substring; "" loads
	}{
		{name: "ok", edit: func(t *testing.T, dir string, md *nodeimage.Metadata) string {
			return filepath.Join(dir, "aws-worker.raw")
		}},
		{name: "tarball of the same stem", edit: func(t *testing.T, dir string, md *nodeimage.Metadata) string {
			os.WriteFile(filepath.Join(dir, "aws-worker.tar.gz"), []byte("tgz"), 0o644)
			md.Outputs = append(md.Outputs, nodeimage.OutputInfo{Format: "gce", File: "aws-worker.tar.gz", Size: 3, SHA256: strings.Repeat("a", 64)})
			return filepath.Join(dir, "aws-worker.tar.gz")
		}},
		{name: "no metadata", want: "aws-worker.json", edit: func(t *testing.T, dir string, md *nodeimage.Metadata) string {
			os.Remove(filepath.Join(dir, "aws-worker.json"))
			return filepath.Join(dir, "aws-worker.raw")
		}},
		{name: "not an output", want: "outputs has no entry for aws-worker.raw", edit: func(t *testing.T, dir string, md *nodeimage.Metadata) string {
			md.Outputs = nil
			return filepath.Join(dir, "aws-worker.raw")
		}},
		{name: "no digest", want: "is not a hex SHA-256", edit: func(t *testing.T, dir string, md *nodeimage.Metadata) string {
			md.Outputs[0].SHA256 = ""
			return filepath.Join(dir, "aws-worker.raw")
		}},
		{name: "size differs", want: "not the file the bake wrote", edit: func(t *testing.T, dir string, md *nodeimage.Metadata) string {
			md.Outputs[0].Size++
			return filepath.Join(dir, "aws-worker.raw")
		}},
		{name: "unknown suffix", want: "not a bake output", edit: func(t *testing.T, dir string, md *nodeimage.Metadata) string {
			return filepath.Join(dir, "aws-worker.img")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			publishtest.RawImage(t, dir, 4<<20, map[int64][]byte{0: []byte("kiln")})
			data, _ := os.ReadFile(filepath.Join(dir, "aws-worker.json"))
			md := new(nodeimage.Metadata)
			json.Unmarshal(data, md)
			path := tc.edit(t, dir, md)
			if _, err := os.Stat(filepath.Join(dir, "aws-worker.json")); err == nil {
				publishtest.WriteMetadata(t, dir, "aws-worker", md)
			}
			im, err := Load(path)
			if tc.want != "" {
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("Load = %v, want an error with %q", err, tc.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if im.Output.File != filepath.Base(path) || im.SHA256 != im.Output.SHA256 || im.DiskSize() != 4<<20 {
				t.Errorf("Load = %+v", im)
			}
		})
	}
}
