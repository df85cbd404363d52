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

// TestCPUAccounting checks the readings against work done: a child that
// burns CPU shows in its own counter while it runs and in this process's
// children counter once waited for, and the machine was busy meanwhile.
// This process stands for a postmaster: clusterCPU counts its live child,
// then the same CPU through its children counter once the child exited.
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
	cluster0 := clusterCPU(os.Getpid())
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
	clusterRunning := clusterCPU(os.Getpid())
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
	if d := clusterRunning - cluster0; d < running {
		t.Errorf("the cluster grew by %v while its child had burnt %v", d, running)
	}
	if d := clusterCPU(os.Getpid()) - cluster0; d < running {
		t.Errorf("the cluster grew by %v once its child exited, less than the %v it burnt", d, running)
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
