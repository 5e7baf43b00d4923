package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/a2a-bus/a2a-bus/pipebus"
	"github.com/a2a-bus/a2a-bus/wire"
)

// buildServe builds the a2a-bus command into a temporary folder, which
// cleanup removes.
func buildServe() (bin string, cleanup func(), err error) {
	return build("github.com/a2a-bus/a2a-bus/cmd/a2a-bus", "a2a-bus")
}

// build builds a command of this module's build list (pkg) into a
// temporary folder, named name, which cleanup removes.
func build(pkg, name string) (bin string, cleanup func(), err error) {
	dir, err := os.MkdirTemp("", "a2a-bus-bench-bin-")
	if err != nil {
		return "", nil, err
	}
	bin = filepath.Join(dir, name)
	cmd := exec.Command("go", "build", "-o", bin, pkg)
	if msg, err := cmd.CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return "", nil, fmt.Errorf("go build: %v: %s", err, msg)
	}
	return bin, func() { os.RemoveAll(dir) }, nil
}

// startup measures `a2a-bus serve` from exec to ready, and its resident
// memory once ready, for a bus. Ready is the connection file's path on
// stderr (NATS), or the first answer on the pipe.
func startup(bin, bus string, runs int) (ready time.Duration, rssKiB int, err error) {
	var total time.Duration
	for range runs {
		tmp, err := os.MkdirTemp("", "a2a-bus-bench-")
		if err != nil {
			return 0, 0, err
		}
		d, rss, err := startOnce(bin, bus, tmp)
		os.RemoveAll(tmp)
		if err != nil {
			return 0, 0, err
		}
		total += d
		rssKiB = max(rssKiB, rss)
	}
	return total / time.Duration(runs), rssKiB, nil
}

func startOnce(bin, bus, tmp string) (time.Duration, int, error) {
	args := []string{"serve", "--bus=" + bus, "--data-dir=" + filepath.Join(tmp, "data"), "--log-level=warn"}
	env := append(os.Environ(), "XDG_RUNTIME_DIR="+tmp, "XDG_STATE_HOME="+tmp)
	start := time.Now()
	if bus == "pipe" {
		cmd := exec.Command(bin, args...)
		cmd.Env = env
		ch, err := pipebus.Start(cmd, pipebus.ClientConfig{})
		if err != nil {
			return 0, 0, err
		}
		defer ch.Close()
		s, err := ch.Session(context.Background(), "probe")
		if err != nil {
			return 0, 0, err
		}
		empty, zero := "", uint64(0)
		_, err = s.Call(context.Background(), wire.MethodReplay, wire.ReplayParams{ContextID: "probe", Epoch: &empty, AfterSeq: &zero})
		var we *wire.Error
		if !errors.As(err, &we) {
			return 0, 0, fmt.Errorf("probe: %v", err)
		}
		ready := time.Since(start)
		rss, err := residentKiB(ch.Pid())
		return ready, rss, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return 0, 0, err
	}
	if err := cmd.Start(); err != nil {
		return 0, 0, err
	}
	defer func() {
		cmd.Process.Signal(os.Interrupt)
		cmd.Wait()
	}()
	r := bufio.NewReader(stderr)
	if _, err := r.ReadString('\n'); err != nil {
		return 0, 0, fmt.Errorf("no connection file line: %v", err)
	}
	ready := time.Since(start)
	go io.Copy(io.Discard, r)
	rss, err := residentKiB(cmd.Process.Pid)
	return ready, rss, err
}

// residentKiB reads VmRSS of a process.
func residentKiB(pid int) (int, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(rest)
			if len(f) > 0 {
				return strconv.Atoi(f[0])
			}
		}
	}
	return 0, errors.New("no VmRSS")
}
