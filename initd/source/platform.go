package source

import (
	"fmt"
	"strings"
)

// Platforms are the values of kiln.platform= that ForPlatform knows.
const Platforms = "qemu, aws, gce, metal"

// ForPlatform returns the config sources for a platform (the kiln.platform= value), in the
// order Select should ask them:
//
//	qemu:  cmdline-url, fw_cfg, cidata
//	aws:   cmdline-url, aws-imds
//	gce:   cmdline-url, gce-metadata
//	metal: cmdline-url, cidata
//
// cmdline is the kernel command line, read by the cmdline-url source. The image's
// embedded default is not in the list: it is merged under whatever config is found.
func ForPlatform(platform, cmdline string) ([]Provider, error) {
	url := &CmdlineURL{Cmdline: cmdline}
	switch platform {
	case "qemu":
		return []Provider{url, &FWCfg{}, CIDATA{}}, nil
	case "aws":
		return []Provider{url, &AWS{}}, nil
	case "gce":
		return []Provider{url, &GCE{}}, nil
	case "metal":
		return []Provider{url, CIDATA{}}, nil
	case "":
		return nil, fmt.Errorf("no kiln.platform= on the kernel command line (one of %s)", Platforms)
	default:
		return nil, fmt.Errorf("kiln.platform=%s: unknown platform (one of %s)", strings.TrimSpace(platform), Platforms)
	}
}
