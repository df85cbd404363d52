package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/procfs"
)

// cpuTimes is the CPU time spent during one slice, by whom: the variant's
// proxy process, the PostgreSQL server (every process of the cluster the
// store uses, exited backends included), the upstream, this process (the
// load) with its children that ended in the slice (pgbench), and the
// whole machine's busy and idle time. It answers what a request costs in
// CPU, and who pays, where throughput alone cannot: on two cores the load,
// the upstream, the proxy and the database all share them.
type cpuTimes struct {
	proxy, db, upstream, load time.Duration
	busy, idle                time.Duration
}

func (c cpuTimes) sub(d cpuTimes) cpuTimes {
	return cpuTimes{c.proxy - d.proxy, c.db - d.db, c.upstream - d.upstream, c.load - d.load, c.busy - d.busy, c.idle - d.idle}
}

func (c cpuTimes) add(d cpuTimes) cpuTimes {
	return cpuTimes{c.proxy + d.proxy, c.db + d.db, c.upstream + d.upstream, c.load + d.load, c.busy + d.busy, c.idle + d.idle}
}

// userHZ is the unit of the times in /proc (USER_HZ), 100 on every Linux
// architecture Go runs on, as procfs assumes too.
const userHZ = 100

// procStat reads a process's /proc/PID/stat; ok is false when it cannot.
func procStat(pid int) (s procfs.ProcStat, ok bool) {
	p, err := procfs.NewProc(pid)
	if err != nil {
		return s, false
	}
	s, err = p.Stat()
	return s, err == nil
}

// seconds turns the CPU seconds procfs reports into a duration.
func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// processCPU is a process's own CPU time; 0 for pid 0 or a process gone.
func processCPU(pid int) time.Duration {
	if pid <= 0 {
		return 0
	}
	s, _ := procStat(pid)
	return seconds(s.CPUTime())
}

// clusterCPU is the CPU time of a PostgreSQL cluster: its postmaster's,
// every live child's, and, through the postmaster's children counters,
// that of every backend that has exited (pgbench's, a closed pool's).
func clusterCPU(postmaster int) time.Duration {
	if postmaster <= 0 {
		return 0
	}
	pm, ok := procStat(postmaster)
	if !ok {
		return 0
	}
	// The children's counters are in clock ticks (CPUTime converts only
	// the process's own).
	total := pm.CPUTime() + float64(pm.CUTime+pm.CSTime)/userHZ
	procs, _ := procfs.AllProcs()
	for _, p := range procs {
		if p.PID == postmaster {
			continue
		}
		if s, err := p.Stat(); err == nil && s.PPID == postmaster {
			total += s.CPUTime()
		}
	}
	return seconds(total)
}

// machineCPU is the machine's busy and idle time from /proc/stat (idle
// counts I/O wait).
func machineCPU() (busy, idle time.Duration) {
	fs, err := procfs.NewDefaultFS()
	if err != nil {
		return 0, 0
	}
	st, err := fs.Stat()
	if err != nil {
		return 0, 0
	}
	c := st.CPUTotal
	return seconds(c.User + c.Nice + c.System + c.IRQ + c.SoftIRQ + c.Steal), seconds(c.Idle + c.Iowait)
}

// selfCPU is this process's CPU time and that of its children waited for.
func selfCPU() time.Duration {
	var self, children syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &self)
	_ = syscall.Getrusage(syscall.RUSAGE_CHILDREN, &children)
	tv := func(t syscall.Timeval) time.Duration { return time.Duration(t.Nano()) }
	return tv(self.Utime) + tv(self.Stime) + tv(children.Utime) + tv(children.Stime)
}

// peakRSS is the largest resident set pid has had (VmHWM), in bytes; 0
// when it cannot be read.
func peakRSS(pid int) int64 {
	p, err := procfs.NewProc(pid)
	if err != nil {
		return 0
	}
	st, err := p.NewStatus()
	if err != nil {
		return 0
	}
	return int64(st.VmHWM)
}

// cpuMeter samples the CPU of one variant's processes.
type cpuMeter struct {
	proxy, upstream, postmaster int
}

func (m cpuMeter) sample() cpuTimes {
	busy, idle := machineCPU()
	return cpuTimes{proxy: processCPU(m.proxy), db: clusterCPU(m.postmaster), upstream: processCPU(m.upstream),
		load: selfCPU(), busy: busy, idle: idle}
}

// postmasterPID is the pid of the postmaster of pg's server, when it runs
// on this machine (its backend is a process here whose parent is the
// postmaster); 0 otherwise.
func postmasterPID(ctx context.Context, pg *pgx.Conn) (int, error) {
	var backend int
	if err := pg.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&backend); err != nil {
		return 0, err
	}
	s, ok := procStat(backend)
	if !ok || s.Comm != "postgres" {
		return 0, nil // another machine's server, or a pooler in between
	}
	return s.PPID, nil
}

// wrapCPU measures the CPU time spent during each slice of v.
func wrapCPU(m cpuMeter, v *variant) {
	wrap := func(f func(context.Context, options) (sliceResult, error)) func(context.Context, options) (sliceResult, error) {
		if f == nil {
			return nil
		}
		return func(ctx context.Context, o options) (sliceResult, error) {
			before := m.sample()
			res, err := f(ctx, o)
			res.cpu = m.sample().sub(before)
			res.peakRSS = peakRSS(m.proxy)
			return res, err
		}
	}
	v.new, v.replay = wrap(v.new), wrap(v.replay)
}

// cpuTable prints the CPU time per request of one phase, by whom, summed
// over the slices: the shares say where a variant's time goes, and the
// total is what one request costs the machine.
func cpuTable(w io.Writer, variants []*variant, results map[string][]sliceResult, phase string) {
	fmt.Fprintf(w, "\nCPU per %s, µs (summed over the slices; database: the whole PostgreSQL cluster; load: the load generator and pgbench; other: the rest of the machine's busy time):\n\n", phase)
	fmt.Fprintln(w, "| variant | proxy | database | upstream | load | other | busy | idle | proxy's peak RSS, MB |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|")
	for _, v := range variants {
		var sum cpuTimes
		ops := 0
		var rss int64
		for _, r := range results[v.name] {
			sum = sum.add(r.cpu)
			ops += r.ops
			rss = max(rss, r.peakRSS)
		}
		if ops == 0 || sum.busy == 0 {
			continue
		}
		per := func(d time.Duration) string {
			return strconv.FormatFloat(float64(d.Nanoseconds())/1e3/float64(ops), 'f', 0, 64)
		}
		other := sum.busy - sum.proxy - sum.db - sum.upstream - sum.load
		px, mem := per(sum.proxy), "–"
		if v.name == "pgbench" {
			px = "–"
		}
		if rss > 0 {
			mem = strconv.FormatFloat(float64(rss)/(1<<20), 'f', 0, 64)
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", v.name, px, per(sum.db), per(sum.upstream),
			per(sum.load), per(other), per(sum.busy), per(sum.idle), mem)
	}
}
