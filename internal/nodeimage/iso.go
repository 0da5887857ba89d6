package nodeimage

import (
	"errors"
	"fmt"
	"os"
	"strings"
)

// ISO 9660's primary volume descriptor: in the 2048-byte sector 16, type 1, "CD001", the
// volume identifier at bytes 40 to 71, padded with spaces.
const (
	isoPVDOffset = 16 * 2048
	isoPVDSize   = 2048
)

// ISOVolumeID reads the volume identifier of the ISO 9660 volume in the file or on the device
// p: an iso output is labelled ISOLabel, which is how stage 1 finds its boot medium.
func ISOVolumeID(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	b := make([]byte, isoPVDSize)
	if _, err := f.ReadAt(b, isoPVDOffset); err != nil {
		return "", fmt.Errorf("no ISO 9660 volume descriptor: %w", err)
	}
	if b[0] != 1 || string(b[1:6]) != "CD001" {
		return "", errors.New("no ISO 9660 primary volume descriptor")
	}
	return strings.TrimRight(string(b[40:72]), " \x00"), nil
}
