package qemucluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kilnproject/kiln/builder/vm"
	"github.com/kilnproject/kiln/internal/atomicfile"
)

// Running returns the pid of node's QEMU, or 0 when it is not running. A pid file whose
// process is gone, or is some other program (the pid reused), counts as not running.
func (s *State) Running(node string) int {
	data, err := os.ReadFile(s.pidFile(node))
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || pid <= 0 {
		return 0
	}
	if !processMatches(pid, s.nodeDir(node)) {
		return 0
	}
	return pid
}

// processMatches reports whether pid is alive and its command line names dir (the node's
// disks are in it), so a reused pid is not taken for the VM.
func processMatches(pid int, dir string) bool {
	if err := syscall.Kill(pid, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return false
	}
	if st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil {
		// A zombie (state Z) has exited.
		if i := strings.LastIndexByte(string(st), ')'); i > 0 && len(st) > i+2 && st[i+2] == 'Z' {
			return false
		}
	}
	return strings.Contains(string(cmdline), dir)
}

// vmConfig is node n's QEMU machine.
func (s *State) vmConfig(n *Node) vm.Config {
	cfg := vm.Config{
		Image:    s.nodeFile(n.Name, diskFile),
		Config:   s.nodeFile(n.Name, configFile),
		Accel:    s.Accel,
		MemoryMB: n.Size.MemoryMB,
		CPUs:     n.Size.CPUs,
		Links:    []vm.Link{{Name: s.Link, MAC: n.MAC}},
		Offline:  true,
		WorkDir:  s.nodeDir(n.Name),
		Nice:     n.Nice,
	}
	if n.EtcdMember != "" {
		cfg.Disks = []vm.Disk{{Name: EtcdDiskSerial, Path: s.EtcdDisk(n.Name)}}
	}
	if n.Role == RoleControlPlane {
		cfg.Forward = map[string]int{fmt.Sprintf("127.0.0.1:%d", n.APIPort): 6443}
	}
	if n.EtcdPort != 0 {
		// etcd listens on the node's link address (and loopback), not on the user network's.
		cfg.ForwardTo = map[string]string{fmt.Sprintf("127.0.0.1:%d", n.EtcdPort): n.Address + ":2379"}
	}
	return cfg
}

// serialArgs replaces the serial console on stdio with the node's console log (appended).
func serialArgs(args []string, log string) ([]string, error) {
	for i, a := range args {
		if strings.HasPrefix(a, "stdio,id=serial0") {
			out := append([]string(nil), args...)
			out[i] = "file,id=serial0,append=on,path=" + strings.ReplaceAll(log, ",", ",,")
			return out, nil
		}
	}
	return nil, errors.New("qemu arguments have no serial console on stdio")
}

// StartNode boots node in the background, detached from this process (its own session,
// stdin /dev/null), its console appended to console.log. A running node is left alone.
func (s *State) StartNode(ctx context.Context, name string) error {
	n, err := s.Node(name)
	if err != nil {
		return err
	}
	if pid := s.Running(name); pid != 0 {
		return nil
	}
	cfg := s.vmConfig(n)
	args, err := vm.Args(ctx, cfg, cfg.WorkDir)
	if err != nil {
		return fmt.Errorf("node %s: %w", name, err)
	}
	if args, err = serialArgs(args, s.ConsoleLog(name)); err != nil {
		return fmt.Errorf("node %s: %w", name, err)
	}
	bin, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		return errors.New("qemu-system-x86_64 not found: install the Debian package qemu-system-x86")
	}
	// A marker line in the console log starts each boot: first-boot lines before it are
	// an earlier boot's.
	if err := appendLine(s.ConsoleLog(name), fmt.Sprintf("%s%s", bootMarker, time.Now().UTC().Format(time.RFC3339))); err != nil {
		return fmt.Errorf("node %s: %w", name, err)
	}
	argv := append([]string{bin}, args...)
	if n.Nice > 0 {
		argv = append([]string{"nice", "-n", strconv.Itoa(n.Nice)}, argv...)
	}
	pid, err := startDetached(argv, s.nodeFile(name, qemuLogFile))
	if err != nil {
		return fmt.Errorf("node %s: %w", name, err)
	}
	if err := atomicfile.Write(s.pidFile(name), []byte(strconv.Itoa(pid)+"\n"), atomicfile.Options{Mode: 0o644}); err != nil {
		syscall.Kill(pid, syscall.SIGKILL)
		return fmt.Errorf("node %s: %w", name, err)
	}
	// QEMU fails fast on a bad argument or a locked disk: say so now, not at the Ready wait.
	time.Sleep(500 * time.Millisecond)
	if !processMatches(pid, s.nodeDir(name)) {
		os.Remove(s.pidFile(name))
		msg, _ := os.ReadFile(s.nodeFile(name, qemuLogFile))
		return fmt.Errorf("node %s: qemu exited at once: %s", name, strings.TrimSpace(lastLines(string(msg), 5)))
	}
	return nil
}

// startDetached starts argv in a session of its own with stdin /dev/null and stdout and
// stderr appended to logPath, and does not wait for it: it outlives this process. It returns
// once the process's command line is readable.
func startDetached(argv []string, logPath string) (int, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return 0, err
	}
	defer logf.Close()
	null, err := os.Open(os.DevNull)
	if err != nil {
		return 0, err
	}
	defer null.Close()
	path, err := exec.LookPath(argv[0])
	if err != nil {
		return 0, fmt.Errorf("start %s: %w", argv[0], err)
	}
	p, err := os.StartProcess(path, argv, &os.ProcAttr{
		Files: []*os.File{null, logf, logf},
		Sys:   &syscall.SysProcAttr{Setsid: true},
	})
	if err != nil {
		return 0, fmt.Errorf("start %s: %w", argv[0], err)
	}
	pid := p.Pid
	// Reap it if it exits while this process lives; after that, init does.
	go p.Wait()
	// The kernel lets this process go on while the child is still inside execve, and its
	// /proc/<pid>/cmdline reads empty until the new program's arguments are in place: wait
	// for them (briefly), so that Running sees the process it was just told about.
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if c, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err != nil || len(c) > 0 {
			break
		}
	}
	return pid, nil
}

// StopNode ends node's QEMU: SIGTERM (QEMU flushes its disks), SIGKILL after timeout. The
// guest is not shut down cleanly, as a power cut. A stopped node is left alone.
func (s *State) StopNode(name string, timeout time.Duration) error {
	if _, err := s.Node(name); err != nil {
		return err
	}
	pid := s.Running(name)
	if pid == 0 {
		os.Remove(s.pidFile(name))
		return nil
	}
	if err := stopProcess(pid, s.nodeDir(name), timeout); err != nil {
		return fmt.Errorf("node %s: %w", name, err)
	}
	os.Remove(s.pidFile(name))
	return nil
}

func stopProcess(pid int, dir string, timeout time.Duration) error {
	syscall.Kill(pid, syscall.SIGTERM)
	deadline := time.Now().Add(timeout)
	for processMatches(pid, dir) {
		if time.Now().After(deadline) {
			syscall.Kill(pid, syscall.SIGKILL)
			time.Sleep(200 * time.Millisecond)
			if processMatches(pid, dir) {
				return fmt.Errorf("qemu (pid %d) survives SIGKILL", pid)
			}
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// bootMarker starts the line StartNode appends to the console log before each boot.
const bootMarker = "=== kiln cluster: VM started "

func appendLine(path, line string) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintln(f, line); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
