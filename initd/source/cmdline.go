package source

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/kilnproject/kiln/internal/cmdline"
)

// Kernel command-line parameters read by CmdlineURL.
const (
	// CmdlineURLKey names the config's URL: kiln.config.url=https://host/${mac}.ign
	CmdlineURLKey = "kiln.config.url"
	// CmdlineTimeoutKey bounds fetching it, retries included: kiln.config.timeout=90s
	// (a Go duration, or plain seconds).
	CmdlineTimeoutKey = "kiln.config.timeout"
)

// DefaultURLTimeout is the overall deadline for fetching kiln.config.url when the command
// line does not set kiln.config.timeout.
const DefaultURLTimeout = 2 * time.Minute

// CmdlineURL fetches the config from the URL given by kiln.config.url= on the kernel
// command line, over http, https or tftp.
//
// The URL may use ${mac} (the primary NIC's MAC: the first non-loopback interface with a
// hardware address, by name, lowercase and colon separated), ${uuid} (the SMBIOS product
// UUID, lowercase), ${hostname} and ${serial} (the SMBIOS product serial). Values are
// path-escaped. Any other ${name} is an error.
//
// Network errors, HTTP 5xx and TFTP timeouts are retried with exponential backoff until
// the overall deadline (kiln.config.timeout=, default DefaultURLTimeout). An HTTP 4xx or
// a TFTP error packet fails at once: the URL is wrong and waiting will not fix it. An
// empty answer is an error too, since the user named this URL as the config.
//
// Select's per-source timeout must leave room for the deadline; Fetch also honours ctx.
type CmdlineURL struct {
	// Cmdline is the kernel command line; "" means read CmdlinePath.
	Cmdline string
	// CmdlinePath is read when Cmdline is ""; "" means /proc/cmdline.
	CmdlinePath string
	// Sysfs is where sysfs is mounted, for the DMI identifiers; "" means /sys.
	Sysfs string
	// Interfaces lists the network interfaces for ${mac}; nil means net.Interfaces.
	Interfaces func() ([]net.Interface, error)
	// Hostname returns ${hostname}; nil means os.Hostname.
	Hostname func() (string, error)
	// HTTPClient fetches http and https URLs; nil means a client with default settings.
	HTTPClient *http.Client
	// Backoff is the first pause between attempts; it doubles up to 8×. 0 means 1s.
	Backoff time.Duration
	// AttemptTimeout bounds one attempt; 0 means 30s.
	AttemptTimeout time.Duration
	// TFTP tunes the tftp client (block size, retransmission).
	TFTP TFTPClient
	// Logger reports retries; nil means slog.Default().
	Logger *slog.Logger
}

// Name implements Provider.
func (*CmdlineURL) Name() string { return "cmdline-url" }

func (c *CmdlineURL) cmdline() (cmdline.Line, error) {
	if c.Cmdline != "" {
		return cmdline.Parse(c.Cmdline), nil
	}
	return cmdline.Read(c.CmdlinePath)
}

// Probe implements Provider: true iff the kernel command line has kiln.config.url=.
func (c *CmdlineURL) Probe(context.Context) bool {
	line, err := c.cmdline()
	if err != nil {
		return false
	}
	_, ok := line.Lookup(CmdlineURLKey)
	return ok
}

// Fetch implements Provider.
func (c *CmdlineURL) Fetch(ctx context.Context) ([]byte, error) {
	line, err := c.cmdline()
	if err != nil {
		return nil, err
	}
	raw, ok := line.Lookup(CmdlineURLKey)
	if !ok {
		return nil, fmt.Errorf("kernel command line has no %s=", CmdlineURLKey)
	}
	timeout := DefaultURLTimeout
	if v, ok := line.Lookup(CmdlineTimeoutKey); ok {
		if timeout, err = parseTimeout(v); err != nil {
			return nil, fmt.Errorf("%s=%s: %w", CmdlineTimeoutKey, v, err)
		}
	}
	u, err := c.configURL(raw)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	data, err := c.fetcher().Get(ctx, u)
	if err != nil {
		return nil, fmt.Errorf("fetch %s: %w", u.Redacted(), err)
	}
	if len(data) == 0 {
		return nil, fmt.Errorf("fetch %s: empty response", u.Redacted())
	}
	return data, nil
}

// configURL expands the variables in kiln.config.url's value and checks the result.
func (c *CmdlineURL) configURL(raw string) (*url.URL, error) {
	expanded, err := c.Expand(raw)
	if err != nil {
		return nil, fmt.Errorf("%s=%s: %w", CmdlineURLKey, raw, err)
	}
	u, err := url.Parse(expanded)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", CmdlineURLKey, err)
	}
	switch u.Scheme {
	case "http", "https", "tftp":
	default:
		return nil, fmt.Errorf("%s=%s: scheme %q not supported (http, https, tftp)", CmdlineURLKey, raw, u.Scheme)
	}
	if u.Host == "" {
		return nil, fmt.Errorf("%s=%s: no host", CmdlineURLKey, raw)
	}
	return u, nil
}

// parseTimeout reads kiln.config.timeout: a duration as package cmdline reads it, above 0.
func parseTimeout(v string) (time.Duration, error) {
	d, err := cmdline.Duration(v)
	if err != nil {
		return 0, err
	}
	if d == 0 {
		return 0, errors.New("must be positive")
	}
	return d, nil
}

// fetcher is how CmdlineURL gets its URL: as a Fetcher with its own settings.
func (c *CmdlineURL) fetcher() Fetcher {
	return Fetcher{HTTPClient: c.HTTPClient, TFTP: c.TFTP, Backoff: c.Backoff, AttemptTimeout: c.AttemptTimeout, Logger: c.Logger}
}

// urlVariables lists the names Expand substitutes, for error messages.
const urlVariables = "hostname, mac, serial, uuid"

// Expand substitutes ${mac}, ${uuid}, ${hostname} and ${serial} in s. Only the variables
// that s uses are looked up, so a URL without ${mac} works on a machine without a NIC.
func (c *CmdlineURL) Expand(s string) (string, error) {
	var b strings.Builder
	cache := map[string]string{}
	for {
		i := strings.Index(s, "${")
		if i < 0 {
			b.WriteString(s)
			return b.String(), nil
		}
		b.WriteString(s[:i])
		end := strings.IndexByte(s[i:], '}')
		if end < 0 {
			return "", fmt.Errorf("unterminated ${ at %q", s[i:])
		}
		name := s[i+2 : i+end]
		v, ok := cache[name]
		if !ok {
			var err error
			if v, err = c.variable(name); err != nil {
				return "", err
			}
			cache[name] = v
		}
		b.WriteString(url.PathEscape(v))
		s = s[i+end+1:]
	}
}

func (c *CmdlineURL) variable(name string) (string, error) {
	switch name {
	case "mac":
		list := c.Interfaces
		if list == nil {
			list = net.Interfaces
		}
		ifaces, err := list()
		if err != nil {
			return "", fmt.Errorf("${mac}: list network interfaces: %w", err)
		}
		mac, err := PrimaryMAC(ifaces)
		if err != nil {
			return "", fmt.Errorf("${mac}: %w", err)
		}
		return mac, nil
	case "uuid":
		v, err := c.dmi("product_uuid")
		return strings.ToLower(v), err
	case "serial":
		return c.dmi("product_serial")
	case "hostname":
		host := c.Hostname
		if host == nil {
			host = os.Hostname
		}
		h, err := host()
		if err != nil {
			return "", fmt.Errorf("${hostname}: %w", err)
		}
		if h == "" {
			return "", errors.New("${hostname}: empty")
		}
		return h, nil
	default:
		return "", fmt.Errorf("unknown variable ${%s} (known: %s)", name, urlVariables)
	}
}

func (c *CmdlineURL) dmi(file string) (string, error) {
	sys := c.Sysfs
	if sys == "" {
		sys = "/sys"
	}
	path := filepath.Join(sys, "class", "dmi", "id", file)
	data, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("read %s: %w", path, err)
	}
	v := strings.TrimSpace(string(data))
	if v == "" {
		return "", fmt.Errorf("%s is empty", path)
	}
	return v, nil
}

// PrimaryMAC returns the MAC address of the first interface, by name, that is not a
// loopback and has a hardware address, lowercase and colon separated.
func PrimaryMAC(ifaces []net.Interface) (string, error) {
	sorted := append([]net.Interface(nil), ifaces...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Name < sorted[j].Name })
	for _, ifc := range sorted {
		if ifc.Flags&net.FlagLoopback != 0 || len(ifc.HardwareAddr) == 0 {
			continue
		}
		return strings.ToLower(ifc.HardwareAddr.String()), nil
	}
	return "", errors.New("no network interface with a MAC address")
}
