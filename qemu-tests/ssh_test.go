package qemutests

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kilnproject/kiln/internal/testkit"
)

// sshClient logs in to a guest's ssh server through a forwarded port, with a key made for
// the test and a known_hosts file of its own.
type sshClient struct {
	port       int
	key        string // private key file
	knownHosts string
	publicKey  string
}

func newSSHClient(t *testing.T, dir string) *sshClient {
	t.Helper()
	if _, err := exec.LookPath("ssh"); err != nil {
		t.Fatal("ssh not installed (openssh-client)")
	}
	c := &sshClient{port: testkit.FreePort(t), key: filepath.Join(dir, "id_ed25519"), knownHosts: filepath.Join(dir, "known_hosts")}
	if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "kiln-test", "-f", c.key).CombinedOutput(); err != nil {
		t.Fatalf("ssh-keygen: %v\n%s", err, out)
	}
	pub, err := os.ReadFile(c.key + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	c.publicKey = strings.TrimSpace(string(pub))
	return c
}

// addr is the host side of the forward, for vm.Config.Forward.
func (c *sshClient) addr() string { return fmt.Sprintf("127.0.0.1:%d", c.port) }

// run runs command as core on the guest, retrying until the server answers or timeout
// passes; hostKeys is ssh's StrictHostKeyChecking ("accept-new" the first time, "yes" once
// the node's key is known).
func (c *sshClient) run(t *testing.T, hostKeys string, timeout time.Duration, command string) string {
	t.Helper()
	return c.runAs(t, "core", hostKeys, timeout, command)
}

// runAs is run as user.
func (c *sshClient) runAs(t *testing.T, user, hostKeys string, timeout time.Duration, command string) string {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		out, err := c.command(user, hostKeys, command).CombinedOutput()
		if err == nil {
			return string(out)
		}
		if strings.Contains(string(out), "HOST IDENTIFICATION HAS CHANGED") || strings.Contains(string(out), "Host key verification failed") {
			t.Fatalf("ssh %s@127.0.0.1 -p %d: the node's host key changed: %s", user, c.port, out)
		}
		if time.Now().After(deadline) {
			t.Fatalf("ssh %s@127.0.0.1 -p %d %q: %v\n%s", user, c.port, command, err, out)
		}
		time.Sleep(5 * time.Second)
	}
}

func (c *sshClient) command(user, hostKeys, command string) *exec.Cmd {
	return exec.Command("ssh", "-p", fmt.Sprint(c.port), "-i", c.key, "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
		"-o", "StrictHostKeyChecking="+hostKeys, "-o", "UserKnownHostsFile="+c.knownHosts, "-o", "ConnectTimeout=20",
		"-o", "LogLevel=ERROR", user+"@127.0.0.1", command)
}

// fire runs command as user once, not waiting for its answer longer than 30 s: for a
// command that takes the connection down with it (a reboot).
func (c *sshClient) fire(user, command string) {
	cmd := c.command(user, "yes", command)
	if err := cmd.Start(); err != nil {
		return
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
	}
}
