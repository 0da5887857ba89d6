package source

import (
	"fmt"
	"strings"
)

// Cloud is a cloud platform as ForPlatform needs it: its kiln.platform= name and its
// config source (cloud.Cloud, from package initd/cloud, is one).
type Cloud interface {
	Name() string
	Source() Provider
}

// Platforms lists the values of kiln.platform= that ForPlatform knows with clouds, as
// its errors name them: qemu, the clouds in order, metal.
func Platforms(clouds []Cloud) string {
	names := []string{"qemu"}
	for _, c := range clouds {
		names = append(names, c.Name())
	}
	return strings.Join(append(names, "metal"), ", ")
}

// ForPlatform returns the config sources for a platform (the kiln.platform= value), in the
// order Select should ask them:
//
//	qemu:    cmdline-url, fw_cfg, cidata
//	<cloud>: cmdline-url, the cloud's Source (aws: aws-imds, gce: gce-metadata)
//	metal:   cmdline-url, cidata, iso-medium
//
// cmdline is the kernel command line, read by the cmdline-url source; clouds are the
// cloud platforms kiln-init knows. The image's embedded default is not in the list: it
// is merged under whatever config is found.
func ForPlatform(platform, cmdline string, clouds []Cloud) ([]Provider, error) {
	url := &CmdlineURL{Cmdline: cmdline}
	switch platform {
	case "qemu":
		return []Provider{url, &FWCfg{}, CIDATA{}}, nil
	case "metal":
		return []Provider{url, CIDATA{}, ISOMedium{}}, nil
	case "":
		return nil, fmt.Errorf("no kiln.platform= on the kernel command line (one of %s)", Platforms(clouds))
	}
	for _, c := range clouds {
		if c.Name() == platform {
			return []Provider{url, c.Source()}, nil
		}
	}
	return nil, fmt.Errorf("kiln.platform=%s: unknown platform (one of %s)", strings.TrimSpace(platform), Platforms(clouds))
}
