// What three ha replicas cost the API server: the requests each replica
// sends, by verb, while the group places its names, in steady state and
// during a takeover; and the CPU time and memory of the kube-apiserver
// and of its etcd over the same windows, against the idle servers.
// Measured on demand, on servers of the test's own.

package kube

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

var (
	loadMeasure = flag.Bool("kube.loadmeasure", false, "measure the load three replicas sharing -kube.loadmeasure.names names put on a kube-apiserver and etcd of the test's own; takes about 5 minutes")
	loadNames   = flag.Int("kube.loadmeasure.names", 100000, "with -kube.loadmeasure: the names the three replicas share")
	loadQPS     = flag.Float64("kube.loadmeasure.qps", 50, "with -kube.loadmeasure: each replica's client rate limit (rest.Config QPS; Burst twice that)")
	loadD       = flag.Duration("kube.loadmeasure.d", 10*time.Second, "with -kube.loadmeasure: the replicas' TTL, the lease duration D")
	loadWindow  = flag.Duration("kube.loadmeasure.window", time.Minute, "with -kube.loadmeasure: the length of the idle and of the steady-state windows")
)

// TestAPIServerLoadMeasurement measures, on a kube-apiserver and etcd
// of its own, three replicas (256 buckets) sharing -kube.loadmeasure.names
// names, each client at -kube.loadmeasure.qps: the requests each
// replica sends, by verb, and the most it sent in one second, while the
// group places its names (the three joining at once), in a steady window
// and from a crash (cut and Close) until the crashed replica's names run
// on the two others; and, over the same windows and an idle one before
// the replicas join, the CPU time (utime + stime) of the kube-apiserver
// and of etcd, and their resident memory at each window's end and at
// its peak (VmHWM). Zero overlap throughout. A measurement, off by
// default:
//
//	go test -count=1 -v -timeout 30m -run '^TestAPIServerLoadMeasurement$' -kube.loadmeasure .
func TestAPIServerLoadMeasurement(t *testing.T) {
	if !*loadMeasure {
		t.Log("a measurement of about 5 minutes, off by default; run it with: go test -count=1 -v -timeout 30m -run '^TestAPIServerLoadMeasurement$' -kube.loadmeasure .")
		return
	}
	if runtime.GOOS != "linux" {
		t.Fatalf("the servers' CPU time and memory are read from /proc, which %s has not", runtime.GOOS)
	}
	c := newCluster(t)
	m := &loadMeter{t: t, pids: [procs]int{c.servers.API.Proc.Pid(), c.servers.Etcd.Pid()}}
	g := newScaleGroupOn(t, c, *loadNames, *loadQPS, *loadD)
	m.verbs = g.verbs

	at := m.mark()
	time.Sleep(*loadWindow) // the idle servers: the baseline
	m.end("idle servers", at, nil)

	at = m.mark()
	peaks := m.peaks()
	g.join()
	m.end("placing the names (3 joining)", at, peaks.stop())

	time.Sleep(g.d) // the joins' last writes settle
	at = m.mark()
	time.Sleep(*loadWindow) // steady state
	m.end("steady state", at, nil)

	at = m.mark()
	peaks = m.peaks()
	g.crashC()
	m.end("a crash, to its names running on the others", at, peaks.stop())

	m.report(c.release, len(g.names), *loadQPS, g.d)
}

// The server processes measured, the indices of loadMeter.pids and of the
// arrays of usage.
const (
	apiServerProc = iota
	etcdProc
	procs // how many
)

var procNames = [procs]string{"kube-apiserver", "etcd"}

// loadMeter measures windows of a load test: the servers' usage and the
// replicas' requests over each. Its fields are the test goroutine's
// alone.
type loadMeter struct {
	t       *testing.T
	pids    [procs]int
	verbs   *tally // the replicas' requests, "replica verb" → requests
	windows []loadWindowed
}

// loadMark is where a window began.
type loadMark struct {
	at    time.Time
	usage [procs]serverUsage
	verbs map[string]int
}

// loadWindowed is what one window measured.
type loadWindowed struct {
	name  string
	took  time.Duration
	cpu   [procs]time.Duration
	rss   [procs]int64   // at the window's end, bytes
	verbs map[string]int // "replica verb" → requests sent in the window
	peaks map[string]int // replica → the most requests it sent in one second of the window; nil if not sampled
	hwm   [procs]int64   // the peak resident memory so far, bytes
}

// usage reads the servers' usage now.
func (m *loadMeter) usage() [procs]serverUsage {
	m.t.Helper()
	var out [procs]serverUsage
	for i, pid := range m.pids {
		u, err := readUsage(pid)
		if err != nil {
			m.t.Fatalf("%s: %v", procNames[i], err)
		}
		out[i] = u
	}
	return out
}

// mark begins a window.
func (m *loadMeter) mark() loadMark {
	m.t.Helper()
	return loadMark{at: time.Now(), usage: m.usage(), verbs: m.verbs.snapshot()}
}

// end ends the window begun at from, named name, with the peaks sampled
// over it (nil if none were), logs it and keeps it for report.
func (m *loadMeter) end(name string, from loadMark, peaks map[string]int) {
	m.t.Helper()
	now := m.usage()
	w := loadWindowed{name: name, took: time.Since(from.at), verbs: map[string]int{}, peaks: peaks}
	for i := range procs {
		w.cpu[i], w.rss[i], w.hwm[i] = now[i].cpu-from.usage[i].cpu, now[i].rss, now[i].hwm
	}
	for k, v := range m.verbs.snapshot() {
		if d := v - from.verbs[k]; d > 0 {
			w.verbs[k] = d
		}
	}
	m.t.Logf("%s: %v; kube-apiserver %v CPU, RSS %s; etcd %v CPU, RSS %s; requests %v; the most in a second %v",
		name, w.took.Round(10*time.Millisecond), w.cpu[apiServerProc], mib(w.rss[apiServerProc]), w.cpu[etcdProc], mib(w.rss[etcdProc]), w.verbs, peaks)
	m.windows = append(m.windows, w)
}

// peakSampler samples the replicas' requests every second, on a
// goroutine of its own that stop ends and joins, and keeps the most
// each sent in one of those seconds.
type peakSampler struct {
	stopped chan struct{} // closed by stop
	done    chan struct{} // closed by the goroutine as it returns
	peaks   map[string]int
}

// peaks starts sampling.
func (m *loadMeter) peaks() *peakSampler {
	p := &peakSampler{stopped: make(chan struct{}), done: make(chan struct{}), peaks: map[string]int{}}
	go func() { // joined by stop
		defer close(p.done)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		last := m.verbs.snapshot()
		for {
			select {
			case <-p.stopped:
				return
			case <-tick.C:
			}
			now := m.verbs.snapshot()
			sent := map[string]int{}
			for k, v := range now {
				sent[strings.Fields(k)[0]] += v - last[k]
			}
			for id, n := range sent {
				p.peaks[id] = max(p.peaks[id], n)
			}
			last = now
		}
	}()
	return p
}

// stop ends the sampling and returns the peaks.
func (p *peakSampler) stop() map[string]int {
	close(p.stopped)
	<-p.done
	return p.peaks
}

// report logs the windows as the tables of docs/replicas-kube.md.
func (m *loadMeter) report(release string, names int, qps float64, d time.Duration) {
	var b strings.Builder
	fmt.Fprintf(&b, "three replicas, %d names, 256 buckets, TTL %v, each client at QPS %v (burst %v), kube-apiserver %s, %d CPUs:\n\n", names, d, qps, 2*qps, release, runtime.NumCPU())
	b.WriteString("| window | length | kube-apiserver CPU | etcd CPU | kube-apiserver RSS | etcd RSS |\n|---|---|---|---|---|---|\n")
	for _, w := range m.windows {
		fmt.Fprintf(&b, "| %s | %.1f s | %s | %s | %s | %s |\n", w.name, w.took.Seconds(),
			cpuShare(w.cpu[apiServerProc], w.took), cpuShare(w.cpu[etcdProc], w.took), mib(w.rss[apiServerProc]), mib(w.rss[etcdProc]))
	}
	last := m.windows[len(m.windows)-1]
	fmt.Fprintf(&b, "\npeak resident memory (VmHWM): kube-apiserver %s, etcd %s\n\n", mib(last.hwm[apiServerProc]), mib(last.hwm[etcdProc]))
	verbs := []string{"get", "list", "watch", "create", "update", "delete"}
	b.WriteString("| window | replica | " + strings.Join(verbs, " | ") + " | all, a second | most in one second |\n|---|---|" + strings.Repeat("---|", len(verbs)+2) + "\n")
	for _, w := range m.windows[1:] {
		for _, id := range []string{"a", "b", "c"} {
			all := 0
			var cells []string
			for _, v := range verbs {
				n := w.verbs[id+" "+v]
				all += n
				cells = append(cells, fmt.Sprintf("%d (%.2f/s)", n, float64(n)/w.took.Seconds()))
			}
			if all == 0 {
				continue // the crashed replica
			}
			peak := "–"
			if w.peaks != nil {
				peak = strconv.Itoa(w.peaks[id])
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %.2f | %s |\n", w.name, id, strings.Join(cells, " | "), float64(all)/w.took.Seconds(), peak)
		}
	}
	m.t.Log(b.String())
}

// cpuShare formats cpu, used over took, as seconds and as a share of one
// core.
func cpuShare(cpu, took time.Duration) string {
	return fmt.Sprintf("%.2f s (%.1f%% of a core)", cpu.Seconds(), 100*cpu.Seconds()/took.Seconds())
}

// mib formats n bytes in MiB.
func mib(n int64) string { return fmt.Sprintf("%.0f MiB", float64(n)/(1<<20)) }

// serverUsage is what /proc says of a process at one moment.
type serverUsage struct {
	cpu      time.Duration // user and system time used since it started, all its threads
	rss, hwm int64         // resident memory now and at its peak, bytes
}

// userHZ is the unit of the times in /proc/PID/stat: USER_HZ, 100 a
// second on every architecture Linux and Go share.
const userHZ = 100

// readUsage reads the usage of process pid from /proc.
func readUsage(pid int) (serverUsage, error) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return serverUsage{}, err
	}
	// The command name, in parentheses, may hold spaces: the fields
	// counted from 3 (state) start after its closing parenthesis.
	fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	if len(fields) < 13 {
		return serverUsage{}, fmt.Errorf("/proc/%d/stat has %d fields after the command; want utime and stime, fields 14 and 15", pid, len(fields)+2)
	}
	var ticks int64
	for _, f := range fields[11:13] { // utime, stime
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return serverUsage{}, fmt.Errorf("/proc/%d/stat: %w", pid, err)
		}
		ticks += n
	}
	u := serverUsage{cpu: time.Duration(ticks) * time.Second / userHZ}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return serverUsage{}, err
	}
	for line := range strings.Lines(string(status)) {
		key, value, _ := strings.Cut(line, ":")
		var dst *int64
		switch key {
		case "VmRSS":
			dst = &u.rss
		case "VmHWM":
			dst = &u.hwm
		default:
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(value), " kB"), 10, 64)
		if err != nil {
			return serverUsage{}, fmt.Errorf("/proc/%d/status: %s: %w", pid, key, err)
		}
		*dst = kb << 10
	}
	if u.rss == 0 || u.hwm == 0 {
		return serverUsage{}, fmt.Errorf("/proc/%d/status has no VmRSS or VmHWM", pid)
	}
	return u, nil
}
