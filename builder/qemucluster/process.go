package qemucluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kilnproject/kiln/builder/vm"
	"github.com/kilnproject/kiln/internal/atomicfile"
)

// Running returns the pid of node's QEMU, or 0 when it is not running. The pid file records
// the process kiln started: its pid, its start time and its exact command line; a process
// that differs in either (the pid reused by another program, a `tail -f` of the node's
// console, another node's QEMU) or is gone counts as not running.
func (s *State) Running(node string) int {
	rec, err := readProcRecord(s.pidFile(node))
	if err != nil || !rec.alive() {
		return 0
	}
	return rec.PID
}

// procRecord identifies a process kiln started: pid, start time (clock ticks after boot,
// /proc/<pid>/stat field 22) and argv. A pid alone is reused; all three together are not.
type procRecord struct {
	PID   int      `json:"pid"`
	Start uint64   `json:"start"`
	Argv  []string `json:"argv"`
}

func readProcRecord(path string) (procRecord, error) {
	var r procRecord
	data, err := os.ReadFile(path)
	if err != nil {
		return r, err
	}
	if err := json.Unmarshal(data, &r); err != nil {
		return r, fmt.Errorf("%s: %w", path, err)
	}
	return r, nil
}

// recordProcess describes the running process pid, started as argv.
func recordProcess(pid int, argv []string) (procRecord, error) {
	start, _, err := procStat(pid)
	if err != nil {
		return procRecord{}, err
	}
	return procRecord{PID: pid, Start: start, Argv: argv}, nil
}

// alive reports whether the recorded process still runs: same pid, same start time, same
// command line, not a zombie.
func (r procRecord) alive() bool {
	if r.PID <= 0 {
		return false
	}
	start, state, err := procStat(r.PID)
	if err != nil || start != r.Start || state == 'Z' {
		return false
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", r.PID))
	if err != nil {
		return false
	}
	return string(cmdline) == strings.Join(r.Argv, "\x00")+"\x00"
}

// procStat reads a process's start time and state from /proc/<pid>/stat.
func procStat(pid int) (start uint64, state byte, err error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, err
	}
	i := strings.LastIndexByte(string(data), ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("/proc/%d/stat: no command", pid)
	}
	// After the command: state is field 3, start time field 22 (fields counted from 1).
	f := strings.Fields(string(data)[i+1:])
	if len(f) < 20 || len(f[0]) != 1 {
		return 0, 0, fmt.Errorf("/proc/%d/stat: too short", pid)
	}
	start, err = strconv.ParseUint(f[19], 10, 64)
	return start, f[0][0], err
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
	cfg.Forward = map[string]int{}
	if n.Role == RoleControlPlane {
		cfg.Forward[fmt.Sprintf("127.0.0.1:%d", n.APIPort)] = 6443
	}
	if n.SSHPort != 0 {
		cfg.Forward[fmt.Sprintf("127.0.0.1:%d", n.SSHPort)] = 22
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
	pid, err := startDetached(argv, s.nodeFile(name, qemuLogFile), n.Nice)
	if err != nil {
		return fmt.Errorf("node %s: %w", name, err)
	}
	rec, err := recordProcess(pid, argv)
	if err == nil {
		err = writeProcRecord(s.pidFile(name), rec)
	}
	if err != nil {
		syscall.Kill(pid, syscall.SIGKILL)
		return fmt.Errorf("node %s: %w", name, err)
	}
	// QEMU fails fast on a bad argument or a locked disk: say so now, not at the Ready wait.
	time.Sleep(500 * time.Millisecond)
	if !rec.alive() {
		os.Remove(s.pidFile(name))
		msg, _ := os.ReadFile(s.nodeFile(name, qemuLogFile))
		return fmt.Errorf("node %s: qemu exited at once: %s", name, strings.TrimSpace(lastLines(string(msg), 5)))
	}
	return nil
}

func writeProcRecord(path string, r procRecord) error {
	data, err := json.Marshal(r)
	if err != nil {
		return err
	}
	return atomicfile.Write(path, append(data, '\n'), atomicfile.Options{Mode: 0o644})
}

// startDetached starts argv in a session of its own with stdin /dev/null and stdout and
// stderr appended to logPath, and does not wait for it: it outlives this process. With nice
// above 0 the process starts with that niceness: every one of its threads has it (a
// setpriority after the start reaches only the threads that exist then; QEMU makes its vCPU
// threads early). It returns once the process's command line is readable.
func startDetached(argv []string, logPath string, nice int) (int, error) {
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
	p, err := startNiced(nice, func() (*os.Process, error) {
		return os.StartProcess(path, argv, &os.ProcAttr{
			Files: []*os.File{null, logf, logf},
			Sys:   &syscall.SysProcAttr{Setsid: true},
		})
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

// startNiced runs start, which forks, on an OS thread of its own whose niceness is nice (when
// above 0): the child inherits it from the forking thread before it runs anything. The thread
// is never given back to the Go runtime (its goroutine ends locked to it, so the runtime ends
// it): a thread's niceness cannot be lowered again without privilege.
func startNiced(nice int, start func() (*os.Process, error)) (*os.Process, error) {
	if nice <= 0 {
		return start()
	}
	type result struct {
		p   *os.Process
		err error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		// On Linux, PRIO_PROCESS with who 0 is the calling thread, and Getpriority answers
		// 20 - nice. A thread already nicer than asked is left as it is.
		if raw, err := syscall.Getpriority(syscall.PRIO_PROCESS, 0); err == nil && 20-raw >= nice {
			p, err := start()
			done <- result{p, err}
			return
		}
		if err := syscall.Setpriority(syscall.PRIO_PROCESS, 0, nice); err != nil {
			done <- result{err: fmt.Errorf("nice %d: %w", nice, err)}
			return
		}
		p, err := start()
		done <- result{p, err}
	}()
	r := <-done
	return r.p, r.err
}

// StopNode ends node's QEMU: SIGTERM (QEMU flushes its disks), SIGKILL after timeout. The
// guest is not shut down cleanly, as a power cut. A stopped node is left alone.
func (s *State) StopNode(name string, timeout time.Duration) error {
	if _, err := s.Node(name); err != nil {
		return err
	}
	rec, err := readProcRecord(s.pidFile(name))
	if err != nil || !rec.alive() {
		os.Remove(s.pidFile(name))
		return nil
	}
	if err := stopProcess(rec, timeout); err != nil {
		return fmt.Errorf("node %s: %w", name, err)
	}
	os.Remove(s.pidFile(name))
	return nil
}

// stopProcess sends SIGTERM to the recorded process, SIGKILL after timeout; it signals
// nothing once the record no longer matches (the process ended, its pid was reused).
func stopProcess(r procRecord, timeout time.Duration) error {
	syscall.Kill(r.PID, syscall.SIGTERM)
	deadline := time.Now().Add(timeout)
	for r.alive() {
		if time.Now().After(deadline) {
			syscall.Kill(r.PID, syscall.SIGKILL)
			time.Sleep(200 * time.Millisecond)
			if r.alive() {
				return fmt.Errorf("qemu (pid %d) survives SIGKILL", r.PID)
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
