// Command serve measures `kiln serve` under load on loopback: it starts kiln serve as its
// own process over a served directory (generated: a 10 MiB kernel and a 60 MiB initramfs,
// or the bake output directory $KILN_PXE_DIR), then runs -clients concurrent clients, each
// fetching -rounds times what a booting machine fetches from it — the chain script, its
// own script, the kernel and the initramfs — and stops. It prints requests/s, throughput,
// latency per route (p50, p99, max), the errors (any is a failure: exit 1) and the
// server's peak RSS (VmHWM).
//
//	go run ./bench/serve -kiln bin/kiln [-clients 500] [-rounds 1]
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kilnproject/kiln/builder/netboot/netboottest"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

func main() {
	kiln := flag.String("kiln", "bin/kiln", "the kiln binary to measure")
	clients := flag.Int("clients", 500, "concurrent clients")
	rounds := flag.Int("rounds", 1, "boots each client goes through")
	flag.Parse()
	if err := run(*kiln, *clients, *rounds); err != nil {
		fmt.Fprintln(os.Stderr, "bench serve:", err)
		os.Exit(1)
	}
}

// routes are what one boot fetches, in order.
var routes = []string{"chain script", "machine script", "kernel", "initramfs"}

// sample is one request's outcome.
type sample struct {
	route int
	dur   time.Duration
	bytes int64
	err   error
}

func run(kiln string, clients, rounds int) error {
	work, err := os.MkdirTemp("", "kiln-bench-serve-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	dir, image, err := servedDir(work)
	if err != nil {
		return err
	}
	if err := writeMachines(filepath.Join(work, "machines.yaml"), image, clients); err != nil {
		return err
	}
	srv, addr, err := startServer(kiln, dir, filepath.Join(work, "machines.yaml"), filepath.Join(work, "serve.log"))
	if err != nil {
		return err
	}
	start := time.Now()
	samples := load(addr, image, clients, rounds)
	wall := time.Since(start)
	hwm := peakRSS(srv.Process.Pid)
	srv.Process.Signal(syscall.SIGTERM)
	waitErr := srv.Wait()
	report(samples, wall, hwm, clients, rounds)
	if waitErr != nil {
		return fmt.Errorf("kiln serve after SIGTERM: %w (log: %s)", waitErr, filepath.Join(work, "serve.log"))
	}
	for _, s := range samples {
		if s.err != nil {
			return errors.New("requests failed")
		}
	}
	return nil
}

// servedDir is $KILN_PXE_DIR with the first image that has a pxe output, or a generated
// one in work.
func servedDir(work string) (dir, image string, err error) {
	if d := os.Getenv("KILN_PXE_DIR"); d != "" {
		matches, _ := filepath.Glob(filepath.Join(d, "*.json"))
		for _, m := range matches {
			var md nodeimage.Metadata
			if data, err := os.ReadFile(m); err == nil && json.Unmarshal(data, &md) == nil && md.PXE != nil {
				return d, strings.TrimSuffix(filepath.Base(m), ".json"), nil
			}
		}
		return "", "", fmt.Errorf("KILN_PXE_DIR=%s holds no <image>-<role>.json with a pxe output", d)
	}
	sizes := netboottest.Sizes{Kernel: 10 << 20, Initrd: 60 << 20, RootFS: 1 << 20, Raw: 1 << 20}
	_, err = netboottest.WriteImage(work, "bench-worker", sizes)
	return work, "bench-worker", err
}

func mac(i int) string { return fmt.Sprintf("02-00-00-00-%02x-%02x", i>>8, i&0xff) }

// writeMachines declares one live group selecting every client's MAC.
func writeMachines(p, image string, clients int) error {
	var b strings.Builder
	fmt.Fprintf(&b, "groups:\n  - name: bench\n    image: %s\n    mode: live\n    selector:\n      mac:\n", image)
	for i := range clients {
		fmt.Fprintf(&b, "        - %s\n", mac(i))
	}
	return os.WriteFile(p, []byte(b.String()), 0o644)
}

// startServer starts kiln serve on a free loopback port and returns it once it listens;
// its log goes to logPath.
func startServer(kiln, dir, machines, logPath string) (*exec.Cmd, string, error) {
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, "", err
	}
	cmd := exec.Command(kiln, "serve", dir, "--config", machines, "--listen", "127.0.0.1:0")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, "", err
	}
	if err := cmd.Start(); err != nil {
		return nil, "", err
	}
	lines := bufio.NewScanner(stderr)
	re := regexp.MustCompile(`msg=serving http=(\S+)`)
	for lines.Scan() {
		fmt.Fprintln(logf, lines.Text())
		if m := re.FindStringSubmatch(lines.Text()); m != nil {
			go func() { io.Copy(logf, stderr); logf.Close() }()
			return cmd, m[1], nil
		}
	}
	cmd.Wait()
	return nil, "", fmt.Errorf("kiln serve did not start (log: %s)", logPath)
}

// load runs the clients and returns every request's sample.
func load(addr, image string, clients, rounds int) []sample {
	tr := &http.Transport{MaxIdleConns: clients, MaxIdleConnsPerHost: clients, DisableCompression: true}
	client := &http.Client{Transport: tr, Timeout: 10 * time.Minute}
	base := "http://" + addr
	pxe := base + "/images/" + image + nodeimage.PXEDirSuffix + "/"
	out := make(chan sample, clients*rounds*len(routes))
	var wg sync.WaitGroup
	for i := range clients {
		wg.Go(func() {
			urls := []string{base + "/boot.ipxe", base + "/boot.ipxe?mac=" + mac(i) + "&uuid=&hostname=",
				pxe + nodeimage.PXEKernelName, pxe + nodeimage.PXEInitrdName}
			for range rounds {
				for r, u := range urls {
					out <- fetch(client, r, u)
				}
			}
		})
	}
	wg.Wait()
	close(out)
	var samples []sample
	for s := range out {
		samples = append(samples, s)
	}
	return samples
}

func fetch(c *http.Client, route int, url string) sample {
	start := time.Now()
	resp, err := c.Get(url)
	if err != nil {
		return sample{route: route, dur: time.Since(start), err: err}
	}
	defer resp.Body.Close()
	n, err := io.Copy(io.Discard, resp.Body)
	s := sample{route: route, dur: time.Since(start), bytes: n, err: err}
	if err == nil && resp.StatusCode != http.StatusOK {
		s.err = fmt.Errorf("%s: %s", url, resp.Status)
	}
	if err == nil && resp.ContentLength >= 0 && n != resp.ContentLength {
		s.err = fmt.Errorf("%s: %d of %d bytes", url, n, resp.ContentLength)
	}
	return s
}

// peakRSS is the process's VmHWM line from /proc.
func peakRSS(pid int) string {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return "?"
	}
	for _, l := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			return strings.TrimSpace(v)
		}
	}
	return "?"
}

func report(samples []sample, wall time.Duration, hwm string, clients, rounds int) {
	var total int64
	errs := 0
	for _, s := range samples {
		total += s.bytes
		if s.err != nil {
			if errs < 5 {
				fmt.Fprintln(os.Stderr, "error:", s.err)
			}
			errs++
		}
	}
	fmt.Printf("\nkiln serve on loopback: %d clients x %d boot(s), %d requests in %.1f s\n", clients, rounds, len(samples), wall.Seconds())
	fmt.Printf("  requests/s                 %8.0f\n", float64(len(samples))/wall.Seconds())
	fmt.Printf("  throughput                 %8.0f MiB/s (%d MiB)\n", float64(total)/(1<<20)/wall.Seconds(), total>>20)
	fmt.Printf("  errors                     %8d\n", errs)
	fmt.Printf("  server peak RSS (VmHWM)    %8s\n", hwm)
	for r, name := range routes {
		var ds []time.Duration
		for _, s := range samples {
			if s.route == r {
				ds = append(ds, s.dur)
			}
		}
		slices.Sort(ds)
		fmt.Printf("  %-16s p50 %8s  p99 %8s  max %8s\n", name, pct(ds, 50), pct(ds, 99), pct(ds, 100))
	}
}

func pct(ds []time.Duration, p int) string {
	if len(ds) == 0 {
		return "-"
	}
	i := (len(ds)*p+99)/100 - 1
	return ds[max(i, 0)].Round(time.Millisecond).String()
}
