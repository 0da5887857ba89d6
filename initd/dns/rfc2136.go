package dns

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"regexp"
	"strings"
	"time"

	mdns "github.com/miekg/dns"
)

// defaultTSIGAlgorithm is the TSIG algorithm RFC2136 signs with unless told otherwise.
const defaultTSIGAlgorithm = "hmac-sha256"

var tsigAlgorithms = map[string]string{
	"hmac-sha1":   mdns.HmacSHA1,
	"hmac-sha224": mdns.HmacSHA224,
	"hmac-sha256": mdns.HmacSHA256,
	"hmac-sha384": mdns.HmacSHA384,
	"hmac-sha512": mdns.HmacSHA512,
}

// RFC2136 publishes records with RFC 2136 dynamic updates to the zone's primary
// server, signed with TSIG (RFC 8945) when KeyName is set; the server's replies must
// then be signed with the same key (errReplyNotSigned otherwise). Updates and lookups go
// over TCP. Each Upsert is one UPDATE message, applied by the server all or nothing: for
// each record it deletes the name's record set of that type and adds the addresses
// (for a Shared record: deletes only the Stale addresses).
type RFC2136 struct {
	// Server is the primary's host:port (10.0.0.53:53).
	Server string
	// Zone is the zone the update is for (k8s.example.com); every record must be in it.
	Zone string
	// KeyName, Secret (base64) and Algorithm (hmac-sha1, -sha224, -sha256, -sha384,
	// -sha512; defaultTSIGAlgorithm when empty) sign the updates; no KeyName: unsigned.
	KeyName   string
	Secret    string
	Algorithm string
	// Timeout bounds each exchange with the server (10 s when 0).
	Timeout time.Duration
}

// Name implements Provider.
func (p *RFC2136) Name() string {
	return fmt.Sprintf("rfc2136 %s zone %s", p.Server, HostName(p.Zone))
}

// RcodeError is a server's refusal of a query or update.
type RcodeError struct {
	Op     string // "update zone example.test" or "query api.example.test A"
	Server string
	Rcode  int // mdns.RcodeRefused, mdns.RcodeNotAuth, …
	// TSIGError is the TSIG error the server gave (mdns.RcodeBadSig, RcodeBadKey,
	// RcodeBadTime) or 0.
	TSIGError int
}

func (e *RcodeError) Error() string {
	msg := fmt.Sprintf("%s at %s: server answered %s", e.Op, e.Server, rcodeName(e.Rcode))
	if e.TSIGError != 0 {
		msg += fmt.Sprintf(" (TSIG %s: the server does not accept the key name or secret)", rcodeName(e.TSIGError))
	} else if e.Rcode == mdns.RcodeRefused || e.Rcode == mdns.RcodeNotAuth {
		msg += " (is the key allowed to update this zone, and is the server primary for it?)"
	}
	return msg
}

func rcodeName(rc int) string {
	if s, ok := mdns.RcodeToString[rc]; ok {
		return s
	}
	return fmt.Sprintf("RCODE%d", rc)
}

func (p *RFC2136) client() (*mdns.Client, string, error) {
	if p.Server == "" {
		return nil, "", invalid(errors.New("rfc2136: no server"))
	}
	if _, _, err := net.SplitHostPort(p.Server); err != nil {
		return nil, "", invalid(fmt.Errorf("rfc2136: server %q is not host:port", p.Server))
	}
	timeout := p.Timeout
	if timeout == 0 {
		timeout = 10 * time.Second
	}
	c := &mdns.Client{Net: "tcp", Timeout: timeout}
	if p.KeyName == "" {
		return c, "", nil
	}
	alg := p.Algorithm
	if alg == "" {
		alg = defaultTSIGAlgorithm
	}
	mAlg, ok := tsigAlgorithms[strings.ToLower(strings.TrimSuffix(alg, "."))]
	if !ok {
		return nil, "", invalid(fmt.Errorf("rfc2136: TSIG algorithm %q is not one of hmac-sha1, hmac-sha224, hmac-sha256, hmac-sha384, hmac-sha512", alg))
	}
	if _, err := base64.StdEncoding.DecodeString(p.Secret); err != nil || p.Secret == "" {
		return nil, "", invalid(fmt.Errorf("rfc2136: TSIG secret of key %s is not base64", p.KeyName))
	}
	c.TsigSecret = map[string]string{FQDN(p.KeyName): p.Secret}
	return c, mAlg, nil
}

// Upsert implements Provider.
func (p *RFC2136) Upsert(ctx context.Context, recs []Record) error {
	if p.Zone == "" {
		return invalid(fmt.Errorf("rfc2136: no zone to update"))
	}
	if todo, err := CheckUpsert(recs, p.Zone); err != nil || !todo {
		return err
	}
	c, alg, err := p.client()
	if err != nil {
		return err
	}
	m := new(mdns.Msg)
	m.SetUpdate(FQDN(p.Zone))
	for _, r := range recs {
		if r.Shared {
			if stale := rrs(r, r.Stale); len(stale) > 0 {
				m.Remove(stale)
			}
		} else {
			m.RemoveRRset([]mdns.RR{&mdns.ANY{Hdr: mdns.RR_Header{Name: FQDN(r.Name), Rrtype: rrtype(r.Type)}}})
		}
		m.Insert(rrs(r, r.Addrs))
	}
	if alg != "" {
		m.SetTsig(FQDN(p.KeyName), alg, 300, time.Now().Unix())
	}
	op := "update zone " + HostName(p.Zone)
	in, _, err := c.ExchangeContext(ctx, m, p.Server)
	if in != nil && in.Rcode != mdns.RcodeSuccess {
		return rcodeError(op, p.Server, in)
	}
	if err := p.checkReply(in, err, alg); err != nil {
		return fmt.Errorf("%s at %s: %w", op, p.Server, err)
	}
	return nil
}

// errReplyNotSigned is matched (errors.Is) by the error for a reply that is not signed
// with the configured TSIG key: unsigned, signed with another key or secret, or with a
// signature outside its time window. Anyone on the path can forge such a reply, so a
// success it reports is not believed.
var errReplyNotSigned = errors.New("reply is not signed with the TSIG key")

// checkReply returns the error of an exchange whose reply came with rcode NOERROR (or
// NXDOMAIN for a lookup), given the exchange's own error err. With a TSIG key (alg set)
// the reply must carry a valid signature made with that key and algorithm.
func (p *RFC2136) checkReply(in *mdns.Msg, err error, alg string) error {
	if alg == "" {
		return err
	}
	notSigned := func(why string) error {
		return fmt.Errorf("%w %s (%s): refusing to trust it, as anyone on the path could have sent it", errReplyNotSigned, HostName(p.KeyName), why)
	}
	switch {
	case errors.Is(err, mdns.ErrTime):
		return notSigned("its signature time is outside the allowed window; is the node's clock right?")
	case errors.Is(err, mdns.ErrSecret):
		return notSigned("signed with another key name")
	case errors.Is(err, mdns.ErrSig), errors.Is(err, mdns.ErrKeyAlg), errors.Is(err, mdns.ErrAlg):
		return notSigned("its signature does not verify with the key's secret: " + err.Error())
	case err != nil:
		return err
	}
	t := in.IsTsig()
	switch {
	case t == nil:
		return notSigned("it carries no TSIG signature")
	case !strings.EqualFold(t.Hdr.Name, FQDN(p.KeyName)):
		return notSigned("signed with key " + HostName(t.Hdr.Name))
	case !strings.EqualFold(FQDN(t.Algorithm), FQDN(alg)):
		return notSigned("signed with algorithm " + HostName(t.Algorithm))
	case t.Error != 0:
		return notSigned("TSIG error " + rcodeName(int(t.Error)))
	}
	return nil
}

// Warning implements warner: updates without TSIG are accepted by the server from
// anyone allowed by address, and the server's replies could come from anyone.
func (p *RFC2136) Warning() string {
	if p.KeyName != "" {
		return ""
	}
	return "updates are not TSIG-signed (no dns.tsigKeyName): the server cannot tell them from a forger's, nor the node the server's replies from a spoofer's"
}

// Lookup implements Provider: it asks Server itself (not a resolver, whose cache
// could be stale) for name's A and AAAA records. With a TSIG key the queries are signed
// and an answer not signed with the key is an error, like an update's reply.
func (p *RFC2136) Lookup(ctx context.Context, name string) ([]netip.Addr, error) {
	c, alg, err := p.client()
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, typ := range []string{TypeA, TypeAAAA} {
		m := new(mdns.Msg)
		m.SetQuestion(FQDN(name), rrtype(typ))
		m.RecursionDesired = false
		if alg != "" {
			m.SetTsig(FQDN(p.KeyName), alg, 300, time.Now().Unix())
		}
		op := "query " + HostName(name) + " " + typ
		in, _, err := c.ExchangeContext(ctx, m, p.Server)
		if in != nil && in.Rcode != mdns.RcodeSuccess && in.Rcode != mdns.RcodeNameError {
			return nil, rcodeError(op, p.Server, in)
		}
		if err := p.checkReply(in, err, alg); err != nil {
			return nil, fmt.Errorf("%s at %s: %w", op, p.Server, err)
		}
		for _, rr := range in.Answer {
			if !strings.EqualFold(rr.Header().Name, FQDN(name)) {
				continue
			}
			switch rr := rr.(type) {
			case *mdns.A:
				if a, ok := netip.AddrFromSlice(rr.A.To4()); ok {
					out = append(out, a)
				}
			case *mdns.AAAA:
				if a, ok := netip.AddrFromSlice(rr.AAAA.To16()); ok {
					out = append(out, a)
				}
			}
		}
	}
	return out, nil
}

func rcodeError(op, server string, in *mdns.Msg) error {
	e := &RcodeError{Op: op, Server: server, Rcode: in.Rcode}
	if t := in.IsTsig(); t != nil && t.Error != 0 {
		e.TSIGError = int(t.Error)
	}
	return e
}

func rrtype(typ string) uint16 {
	if typ == TypeAAAA {
		return mdns.TypeAAAA
	}
	return mdns.TypeA
}

func rrs(r Record, addrs []netip.Addr) []mdns.RR {
	var out []mdns.RR
	for _, a := range addrs {
		hdr := mdns.RR_Header{Name: FQDN(r.Name), Rrtype: rrtype(r.Type), Class: mdns.ClassINET, Ttl: uint32(r.TTL)}
		if a.Is4() {
			out = append(out, &mdns.A{Hdr: hdr, A: a.AsSlice()})
		} else {
			out = append(out, &mdns.AAAA{Hdr: hdr, AAAA: a.AsSlice()})
		}
	}
	return out
}

var (
	keyAlgorithm = regexp.MustCompile(`(?m)^\s*algorithm\s+"?([A-Za-z0-9.-]+)"?\s*;`)
	keySecret    = regexp.MustCompile(`(?m)^\s*secret\s+"([A-Za-z0-9+/=]+)"\s*;`)
)

// loadTSIGSecret reads a TSIG secret file (dns.tsigSecretFile): either the base64
// secret alone or a BIND key clause as tsig-keygen writes it
// (key "name" { algorithm hmac-sha256; secret "…"; };). It returns the secret and the
// algorithm the file names ("" for a bare secret).
func loadTSIGSecret(path string) (secret, algorithm string, err error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", "", fmt.Errorf("tsig secret: %w", err)
	}
	text := strings.TrimSpace(string(data))
	if m := keySecret.FindStringSubmatch(text); m != nil {
		secret = m[1]
		if a := keyAlgorithm.FindStringSubmatch(text); a != nil {
			algorithm = a[1]
		}
	} else if !strings.ContainsAny(text, " \t\n{};\"") {
		secret = text
	}
	if _, derr := base64.StdEncoding.DecodeString(secret); secret == "" || derr != nil {
		return "", "", fmt.Errorf("tsig secret %s: neither a base64 secret nor a key clause with secret \"…\";", path)
	}
	return secret, algorithm, nil
}
