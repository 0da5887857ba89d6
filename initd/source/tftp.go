package source

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/kilnproject/kiln/internal/fetch"
)

// TFTP opcodes (RFC 1350, RFC 2347).
const (
	tftpRRQ   = 1
	tftpDATA  = 3
	tftpACK   = 4
	tftpERROR = 5
	tftpOACK  = 6
)

// TFTP error codes sent by the client.
const (
	tftpErrDiskFull   = 3
	tftpErrUnknownTID = 5
	tftpErrOption     = 8
)

// DefaultTFTPBlockSize is the block size the client asks for (RFC 2348): the largest
// that fits one Ethernet frame (1500 - 20 IP - 8 UDP - 4 TFTP).
const DefaultTFTPBlockSize = 1468

// TFTPClient reads one file over TFTP (RFC 1350) in octet mode, asking for a larger block
// size with the blksize option (RFC 2347, RFC 2348); a server that ignores the option is
// read with 512-byte blocks. It retransmits its last packet when the server is silent,
// re-acknowledges duplicate blocks, rejects packets from a foreign transfer ID, follows
// the block number across the 65535 wrap and stops at MaxConfigSize.
type TFTPClient struct {
	// BlockSize is the blksize to request, 8..65464; 0 means DefaultTFTPBlockSize;
	// 512 sends no option.
	BlockSize int
	// Timeout is how long to wait for a packet before retransmitting; 0 means 1s.
	Timeout time.Duration
	// Retries is how often to retransmit one packet before giving up; 0 means 5.
	Retries int
}

// tftpServerError is an ERROR packet from the server, e.g. "File not found".
type tftpServerError struct {
	Code    uint16
	Message string
}

func (e *tftpServerError) Error() string {
	return fmt.Sprintf("tftp server error %d: %s", e.Code, e.Message)
}

// Get reads file from the server at host (host or host:port; port 69 by default).
// An error packet from the server is a permanent error; silence is not.
func (t TFTPClient) Get(ctx context.Context, host, file string) ([]byte, error) {
	blksize := t.BlockSize
	if blksize == 0 {
		blksize = DefaultTFTPBlockSize
	}
	if blksize < 8 || blksize > 65464 {
		return nil, fetch.Permanent(fmt.Errorf("tftp block size %d out of range 8..65464", blksize))
	}
	if _, _, err := net.SplitHostPort(host); err != nil {
		host = net.JoinHostPort(strings.Trim(host, "[]"), "69")
	}
	server, err := net.ResolveUDPAddr("udp", host)
	if err != nil {
		return nil, fmt.Errorf("tftp: resolve %s: %w", host, err)
	}
	conn, err := net.ListenUDP("udp", nil)
	if err != nil {
		return nil, fmt.Errorf("tftp: %w", err)
	}
	defer conn.Close()
	// Wake a blocked read as soon as ctx ends.
	stop := context.AfterFunc(ctx, func() { _ = conn.SetReadDeadline(time.Unix(1, 0)) })
	defer stop()

	tr := &tftpTransfer{conn: conn, server: server, want: blksize, blksize: 512, expect: 1}
	tr.last = tftpRequest(file, blksize)
	tr.lastTo = server
	if err := tr.send(); err != nil {
		return nil, err
	}
	return tr.receive(ctx, file, t.timeout(), t.retries())
}

func (t TFTPClient) timeout() time.Duration {
	if t.Timeout <= 0 {
		return time.Second
	}
	return t.Timeout
}

func (t TFTPClient) retries() int {
	if t.Retries <= 0 {
		return 5
	}
	return t.Retries
}

// receive handles the server's packets until the last block is in, retransmitting the last
// packet sent when the server is silent for timeout, up to retries times in a row.
func (tr *tftpTransfer) receive(ctx context.Context, file string, timeout time.Duration, retries int) ([]byte, error) {
	buf := make([]byte, 4+max(tr.want, 512)+1)
	tries := 0
	for {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("tftp %s: %w", file, err)
		}
		deadline := time.Now().Add(timeout)
		if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
			deadline = d
		}
		_ = tr.conn.SetReadDeadline(deadline)
		n, from, err := tr.conn.ReadFromUDP(buf)
		if err != nil {
			var ne net.Error
			if !errors.As(err, &ne) || !ne.Timeout() {
				return nil, fmt.Errorf("tftp: %w", err)
			}
			if ctx.Err() != nil {
				continue // reported at the top of the loop
			}
			if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
				// The read hit ctx's deadline a moment before ctx itself expired.
				return nil, fmt.Errorf("tftp %s: %w", file, context.DeadlineExceeded)
			}
			if tries++; tries > retries {
				return nil, fmt.Errorf("tftp %s: no answer from %s after %d tries", file, tr.server, tries)
			}
			if err := tr.send(); err != nil {
				return nil, err
			}
			continue
		}
		done, err := tr.handle(buf[:n], from)
		if err != nil {
			return nil, fmt.Errorf("tftp %s: %w", file, err)
		}
		if done {
			return tr.data.Bytes(), nil
		}
		if tr.progressed {
			tries = 0
			tr.progressed = false
		}
	}
}

// tftpTransfer is the state of one read transfer.
type tftpTransfer struct {
	conn       *net.UDPConn
	server     *net.UDPAddr
	peer       *net.UDPAddr // the server's transfer ID, set by its first answer
	want       int          // requested block size
	blksize    int          // block size in force
	expect     uint16       // next block number
	data       bytes.Buffer
	last       []byte // last packet sent, for retransmission
	lastTo     *net.UDPAddr
	progressed bool
}

func (tr *tftpTransfer) send() error {
	if _, err := tr.conn.WriteToUDP(tr.last, tr.lastTo); err != nil {
		return fmt.Errorf("tftp: send to %s: %w", tr.lastTo, err)
	}
	return nil
}

func (tr *tftpTransfer) ack(block uint16) error {
	tr.last = binary.BigEndian.AppendUint16(binary.BigEndian.AppendUint16(nil, tftpACK), block)
	tr.lastTo = tr.peer
	return tr.send()
}

// abort tells the server why the client stops; the transfer fails with err.
func (tr *tftpTransfer) abort(to *net.UDPAddr, code uint16, err error) error {
	_, _ = tr.conn.WriteToUDP(tftpErrorPacket(code, err.Error()), to)
	return fetch.Permanent(err)
}

// handle processes one packet; done is true once the last block is in.
func (tr *tftpTransfer) handle(pkt []byte, from *net.UDPAddr) (done bool, err error) {
	if tr.peer == nil {
		if !from.IP.Equal(tr.server.IP) {
			return false, nil // not our server: ignore
		}
	} else if !from.IP.Equal(tr.peer.IP) || from.Port != tr.peer.Port {
		_, _ = tr.conn.WriteToUDP(tftpErrorPacket(tftpErrUnknownTID, "unknown transfer ID"), from)
		return false, nil
	}
	if len(pkt) < 4 {
		return false, tr.abort(from, 4, fmt.Errorf("short packet of %d bytes from %s", len(pkt), from))
	}
	op := binary.BigEndian.Uint16(pkt)
	switch op {
	case tftpERROR:
		msg, _, _ := bytes.Cut(pkt[4:], []byte{0})
		return false, fetch.Permanent(&tftpServerError{Code: binary.BigEndian.Uint16(pkt[2:]), Message: string(msg)})
	case tftpOACK:
		if tr.peer != nil {
			if tr.expect == 1 {
				return false, tr.ack(0) // our ACK of the OACK was lost
			}
			return false, nil
		}
		tr.peer = from
		size, err := parseOACK(pkt[2:], tr.want)
		if err != nil {
			return false, tr.abort(from, tftpErrOption, err)
		}
		tr.blksize = size
		tr.progressed = true
		return false, tr.ack(0)
	case tftpDATA:
		if tr.peer == nil {
			tr.peer = from // the server ignored our options: 512-byte blocks
		}
		block := binary.BigEndian.Uint16(pkt[2:])
		payload := pkt[4:]
		switch block {
		case tr.expect:
		case tr.expect - 1:
			if block != 0 {
				return false, tr.ack(block) // duplicate: our ACK was lost
			}
			return false, nil
		default:
			return false, nil
		}
		if len(payload) > tr.blksize {
			return false, tr.abort(from, 4, fmt.Errorf("block %d has %d bytes, block size is %d", block, len(payload), tr.blksize))
		}
		if tr.data.Len()+len(payload) > MaxConfigSize {
			return false, tr.abort(from, tftpErrDiskFull, &TooLargeError{What: "the file", Limit: MaxConfigSize})
		}
		tr.data.Write(payload)
		tr.progressed = true
		if err := tr.ack(block); err != nil {
			return false, err
		}
		tr.expect++
		return len(payload) < tr.blksize, nil
	default:
		return false, tr.abort(from, 4, fmt.Errorf("unexpected opcode %d from %s", op, from))
	}
}

// tftpRequest builds a read request in octet mode, with blksize unless it is 512.
func tftpRequest(file string, blksize int) []byte {
	p := binary.BigEndian.AppendUint16(nil, tftpRRQ)
	p = append(append(p, file...), 0)
	p = append(p, "octet\x00"...)
	if blksize != 512 {
		p = append(p, "blksize\x00"...)
		p = append(append(p, strconv.Itoa(blksize)...), 0)
	}
	return p
}

func tftpErrorPacket(code uint16, msg string) []byte {
	p := binary.BigEndian.AppendUint16(nil, tftpERROR)
	p = binary.BigEndian.AppendUint16(p, code)
	return append(append(p, msg...), 0)
}

// parseOACK returns the block size an option acknowledgement grants. Options the client
// did not ask for, or a block size above the one asked for, are errors (RFC 2347).
func parseOACK(opts []byte, want int) (int, error) {
	blksize := 512
	fields := bytes.Split(opts, []byte{0})
	if len(fields) > 0 && len(fields[len(fields)-1]) == 0 {
		fields = fields[:len(fields)-1]
	}
	if len(fields)%2 != 0 {
		return 0, errors.New("malformed option acknowledgement")
	}
	for i := 0; i < len(fields); i += 2 {
		name, value := strings.ToLower(string(fields[i])), string(fields[i+1])
		if name != "blksize" {
			return 0, fmt.Errorf("server acknowledged option %q that was not requested", name)
		}
		n, err := strconv.Atoi(value)
		if err != nil || n < 8 || n > want {
			return 0, fmt.Errorf("server granted blksize %q, asked for at most %d", value, want)
		}
		blksize = n
	}
	return blksize, nil
}
