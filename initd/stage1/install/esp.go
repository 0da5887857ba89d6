package install

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/diskfs/go-diskfs/backend"
	"github.com/diskfs/go-diskfs/filesystem/fat32"
	"github.com/diskfs/go-diskfs/partition/gpt"

	"github.com/kilnproject/kiln/internal/nodeimage"
)

// imageSectorSize is the sector size kiln images are laid out for.
const imageSectorSize = 512

// checkImage reads the staged image's GPT and returns its ESP, partition 1.
func checkImage(b backend.Storage) (*gpt.Partition, error) {
	t, err := gpt.Read(b, imageSectorSize, imageSectorSize)
	if err != nil {
		return nil, fmt.Errorf("the image has no valid GPT: %w", err)
	}
	if t.RecoveredFromBackup {
		return nil, fmt.Errorf("the image's primary GPT is damaged")
	}
	for _, p := range t.Partitions {
		if p.Index == 1 {
			if !strings.EqualFold(string(p.Type), nodeimage.TypeESP) {
				return nil, fmt.Errorf("the image's partition 1 has type %s, not the EFI system partition", strings.ToLower(string(p.Type)))
			}
			return p, nil
		}
	}
	return nil, fmt.Errorf("the image's GPT has no partition 1 (the ESP)")
}

// addConfigURL appends " kiln.config.url=<configURL>" to the options line of the boot loader
// entry (nodeimage.LoaderEntryPath) on the image's ESP, keeping the rest of the line, so the
// installed disk's first boot finds the config as a disk boot given that parameter does. A
// kiln.config.url= already on the line stays, and the one appended wins (the last of a key
// counts). It returns the new options line.
func addConfigURL(b backend.Storage, esp *gpt.Partition, configURL string) (string, error) {
	start := int64(esp.Start) * imageSectorSize
	size := int64(esp.End-esp.Start+1) * imageSectorSize
	fs, err := fat32.Read(b, size, start, imageSectorSize)
	if err != nil {
		return "", fmt.Errorf("the image's ESP: %w", err)
	}
	entry, err := readFATFile(fs, nodeimage.LoaderEntryPath)
	if err != nil {
		return "", err
	}
	options, ok := nodeimage.EntryOptions(entry)
	if !ok {
		return "", fmt.Errorf("the image's boot entry %s has no options line", nodeimage.LoaderEntryPath)
	}
	options = strings.TrimSpace(options + " " + paramKey(paramConfigURL) + "=" + configURL)
	f, err := fs.OpenFile(nodeimage.LoaderEntryPath, os.O_RDWR|os.O_TRUNC)
	if err != nil {
		return "", fmt.Errorf("open %s on the image's ESP for writing: %w", nodeimage.LoaderEntryPath, err)
	}
	if _, err := io.WriteString(f, nodeimage.WithEntryOptions(entry, options)); err != nil {
		f.Close()
		return "", fmt.Errorf("write %s on the image's ESP: %w", nodeimage.LoaderEntryPath, err)
	}
	if err := f.Close(); err != nil {
		return "", fmt.Errorf("write %s on the image's ESP: %w", nodeimage.LoaderEntryPath, err)
	}
	return options, nil
}

// paramKey is the kernel parameter name of a key of Cmdline.Kiln: "kiln." + key.
func paramKey(key string) string { return "kiln." + key }

func readFATFile(fs *fat32.FileSystem, name string) (string, error) {
	f, err := fs.OpenFile(name, os.O_RDONLY)
	if err != nil {
		return "", fmt.Errorf("the image's ESP has no %s: %w", name, err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, 64<<10))
	if err != nil {
		return "", fmt.Errorf("read %s on the image's ESP: %w", name, err)
	}
	return string(b), nil
}
