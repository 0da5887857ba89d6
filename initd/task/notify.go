package task

import (
	"fmt"
	"net"
	"os"
)

// Notify sends state (e.g. "READY=1", "STATUS=applying files", "ERRNO=5", several
// separated by newlines) to the service manager over the datagram socket named by
// $NOTIFY_SOCKET, as sd_notify(3) does; a name starting with '@' is in the abstract
// namespace. Without $NOTIFY_SOCKET (not started by systemd, or not a Type=notify
// unit) it does nothing and returns nil.
func Notify(state string) error {
	addr := os.Getenv("NOTIFY_SOCKET")
	if addr == "" {
		return nil
	}
	if addr[0] != '/' && addr[0] != '@' {
		return fmt.Errorf("sd_notify: NOTIFY_SOCKET=%q: want an absolute path or an abstract name starting with '@'", addr)
	}
	// Go maps a leading '@' to the abstract namespace (a leading NUL byte).
	conn, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: addr, Net: "unixgram"})
	if err != nil {
		return fmt.Errorf("sd_notify to %s: %w", addr, err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte(state)); err != nil {
		return fmt.Errorf("sd_notify to %s: %w", addr, err)
	}
	return nil
}
