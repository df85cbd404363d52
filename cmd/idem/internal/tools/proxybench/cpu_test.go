package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"testing"
	"time"
)

func TestParseProcStat(t *testing.T) {
	// A command name may hold spaces and parentheses.
	line := []byte("4242 (post (gres) x) S 17 4242 4242 0 -1 4194560 100 0 0 0 250 75 30 12 20 0 1 0 100 0 0\n")
	s := parseProcStat(line)
	if !s.ok || s.comm != "post (gres) x" || s.ppid != 17 || s.utime != 250 || s.stime != 75 || s.cutime != 30 || s.cstime != 12 {
		t.Errorf("parsed %+v", s)
	}
	for _, bad := range []string{"", "4242 no parentheses", "4242 (short) S 1 2"} {
		if s := parseProcStat([]byte(bad)); s.ok {
			t.Errorf("%q parsed as %+v", bad, s)
		}
	}
}

// TestCPUAccounting checks the readings against work done: a child that
// burns CPU shows in its own counter while it runs and in this process's
// children counter once waited for, and the machine was busy meanwhile.
func TestCPUAccounting(t *testing.T) {
	if os.Getenv("PROXYBENCH_BURN") != "" {
		burn()
		return
	}
	if _, err := os.Stat("/proc/stat"); err != nil {
		t.Skip("no /proc here")
	}
	const work = 300 * time.Millisecond
	busy0, _ := machineCPU()
	self0 := selfCPU()
	cmd := exec.Command(os.Args[0], "-test.run=^TestCPUAccounting$")
	cmd.Env = append(os.Environ(), "PROXYBENCH_BURN=1")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if _, err := bufio.NewReader(stdout).ReadString('\n'); err != nil { // it has burnt work
		t.Fatal(err)
	}
	running := processCPU(cmd.Process.Pid)
	stdin.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	// /proc counts in 10 ms ticks.
	if running < work-10*time.Millisecond {
		t.Errorf("the child's own counter read %v after it burnt %v", running, work)
	}
	if d := selfCPU() - self0; d < running {
		t.Errorf("children's CPU grew by %v once waited for, less than the %v read while it ran", d, running)
	}
	if busy1, _ := machineCPU(); busy1-busy0 < running-10*time.Millisecond {
		t.Errorf("the machine was busy for %v, less than the child alone (%v)", busy1-busy0, running)
	}
	if processCPU(0) != 0 || clusterCPU(0) != 0 {
		t.Error("pid 0 must read as no time")
	}
}

// burn spins until this process has used 300 ms of CPU, says so on
// stdout, and waits for stdin to close.
func burn() {
	x := 0
	for selfCPU() < 300*time.Millisecond {
		for i := range 1_000_000 {
			x += i
		}
	}
	fmt.Println("burnt", x > 0)
	io.Copy(io.Discard, os.Stdin)
}

func TestPeakRSS(t *testing.T) {
	status := []byte("Name:\tidem\nVmPeak:\t  900000 kB\nVmHWM:\t   61234 kB\nVmRSS:\t   50000 kB\n")
	if got := parsePeakRSS(status); got != 61234<<10 {
		t.Errorf("VmHWM 61234 kB parsed as %d bytes", got)
	}
	for _, bad := range []string{"", "VmRSS:\t 5 kB\n", "VmHWM:\t 5 pages\n", "VmHWM:\t x kB\n"} {
		if got := parsePeakRSS([]byte(bad)); got != 0 {
			t.Errorf("%q parsed as %d", bad, got)
		}
	}
	if _, err := os.Stat("/proc/self/status"); err != nil {
		t.Skip("no /proc here")
	}
	// Touch 64 MiB: the peak must count them.
	b := make([]byte, 64<<20)
	for i := range b {
		b[i] = 1
	}
	if got := peakRSS(os.Getpid()); got < 64<<20 {
		t.Errorf("peak RSS %d bytes after touching 64 MiB", got)
	}
	runtime.KeepAlive(b)
}
