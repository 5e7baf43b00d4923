package host_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/a2a-bus/a2a-bus/host"
	"github.com/a2a-bus/a2a-bus/runtime"
	"github.com/a2a-bus/a2a-bus/wire"
)

// childRole, set in a child's environment, makes the test binary play a
// part instead of running the tests (TestMain): one of the fake brokers
// below, or hostRole.
const childRole = "A2A_HOST_TEST_CHILD"

// The fake brokers on a pipe: each answers the first request (a starting
// broker's first answer, which makes it up) and then goes bad, alive all
// the while.
const (
	// silentRole reads every request and answers none.
	silentRole = "silent"
	// garbageRole answers every request with a line that is not JSON.
	garbageRole = "garbage"
	// endlessRole writes one line that never ends, past any bound.
	endlessRole = "endless"
	// hostRole is a small host program (hostChild).
	hostRole = "host"
	// relayRole is a broker on a pipe that holds one answer (relayChild).
	relayRole = "relay"
)

// The environment of a hostRole child.
const (
	hostBusEnv  = "A2A_HOST_TEST_BUS"  // "pipe" or "nats"
	hostArgsEnv = "A2A_HOST_TEST_ARGS" // pipe: the broker command, as JSON; nats: the connection file
	// relayDirEnv names a relayRole child's folder of FIFOs.
	relayDirEnv = "A2A_HOST_TEST_RELAY"
	// relayHoldEnv says which answer a relayRole child holds: holdHealth
	// or holdCall.
	relayHoldEnv = "A2A_HOST_TEST_HOLD"
)

// The answers a relay may hold.
const (
	// holdHealth holds the answer to the host's first health check.
	holdHealth = "health"
	// holdCall holds the answer to a runtime's call (a poll while a
	// delegate waits) made after that check.
	holdCall = "call"
)

// unixRoles are the roles of the tests that run only on Unix; their
// files add them.
var unixRoles = map[string]func() int{}

// childCommand runs the test binary again in a role.
func childCommand(role string, env ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(append(os.Environ(), childRole+"="+role), env...)
	return cmd
}

func runChild(role string) int {
	switch role {
	case silentRole, garbageRole, endlessRole:
		return fakeBrokerChild(role)
	case relayRole:
		if err := relayChild(os.Args[1:], os.Getenv(relayDirEnv), os.Getenv(relayHoldEnv)); err != nil {
			fmt.Fprintln(os.Stderr, "relay child:", err)
			return 1
		}
		return 0
	case hostRole:
		if err := hostChild(); err != nil {
			fmt.Fprintln(os.Stderr, "host child:", err)
			return 1
		}
		return 0
	}
	if child, ok := unixRoles[role]; ok {
		return child()
	}
	fmt.Fprintln(os.Stderr, "unknown child role", role)
	return 2
}

// fakeBrokerChild answers its first request, then plays role until the
// end of its input.
func fakeBrokerChild(role string) int {
	in := bufio.NewReader(os.Stdin)
	line, err := in.ReadBytes('\n')
	if err != nil {
		return 1
	}
	var req struct {
		ID json.RawMessage `json:"id"`
	}
	if err := json.Unmarshal(line, &req); err != nil {
		return 1
	}
	fmt.Fprintf(os.Stdout, `{"jsonrpc":"2.0","id":%s,"result":{}}`+"\n", req.ID)
	switch role {
	case silentRole:
		io.Copy(io.Discard, in)
	case garbageRole:
		for {
			if _, err := in.ReadBytes('\n'); err != nil {
				return 0
			}
			if _, err := os.Stdout.WriteString("garbage, not JSON {\n"); err != nil {
				return 0
			}
		}
	case endlessRole:
		// The end of the input ends the process, mid-line.
		go func() {
			io.Copy(io.Discard, in)
			os.Exit(0)
		}()
		os.Stdout.WriteString(`{"jsonrpc":"2.0","id":2,"result":"`)
		// 64 MiB/s: past the host's 64 MiB bound within about a second,
		// without taking a core from the tests beside it.
		chunk := bytes.Repeat([]byte("x"), 64<<10)
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for range tick.C {
			if _, err := os.Stdout.Write(chunk); err != nil {
				return 0
			}
		}
	}
	return 0
}

// relayChild runs the broker argv names as its own child and relays the
// pipe both ways, line by line, but for one answer: once a line comes on
// the FIFO dir/arm (the test writes it when the host is ready, its
// delegate waiting), the answer to the host's next a2a.admin.info (a
// health check) with holdHealth, or to the first poll after that check
// (holdCall). That answer it holds, says so by a line on the FIFO
// dir/seen (with holdHealth, once the host's next call is in flight too),
// and passes on only once a line comes on the FIFO dir/release; every
// later answer waits behind it. A test so stops the host while its calls
// wait, and has their answers come after.
func relayChild(argv []string, dir, hold string) error {
	if len(argv) == 0 || dir == "" || (hold != holdHealth && hold != holdCall) {
		return errors.New("no broker, no folder, or nothing to hold")
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	var armed atomic.Bool
	go func() {
		// Ends with the line, or with the test's end of the FIFO.
		if fifoLine(filepath.Join(dir, "arm"), false) == nil {
			armed.Store(true)
		}
	}()
	held := make(chan string, 1) // the id of the call whose answer to hold
	// followed is closed once the host sent a call after the one whose
	// answer is held.
	followed := make(chan struct{})
	go func() {
		// Host to broker; the end of the host's input is the broker's.
		defer in.Close()
		r := bufio.NewReader(os.Stdin)
		const (
			waiting = iota // to be armed, then for a health check
			checked        // a health check came since (holdCall)
			holding        // an answer is held
			done           // and a call came after it
		)
		state := waiting
		for {
			line, err := r.ReadBytes('\n')
			var req struct {
				ID     json.RawMessage `json:"id"`
				Method string          `json:"method"`
			}
			if json.Unmarshal(line, &req) == nil {
				switch {
				case state == holding:
					close(followed)
					state = done
				case state == waiting && req.Method == wire.MethodAdminInfo && armed.Load():
					state = checked
					if hold == holdHealth {
						held <- string(req.ID)
						state = holding
					}
				case state == checked && req.Method == wire.MethodReplay:
					held <- string(req.ID)
					state = holding
				}
			}
			if _, werr := in.Write(line); werr != nil || err != nil {
				return
			}
		}
	}()
	r := bufio.NewReader(out)
	var id string // the answer to hold
	for {
		line, err := r.ReadBytes('\n')
		if id == "" {
			select {
			case id = <-held:
			default:
			}
		}
		var res struct {
			ID json.RawMessage `json:"id"`
		}
		if id != "" && json.Unmarshal(line, &res) == nil && string(res.ID) == id {
			id = "-" // once
			// Every answer waits behind this one. Behind a health check's,
			// the runtime's next poll (due within 100 ms: a delegate
			// waits) is sent and waits too: the host is stopped with both
			// in flight. Behind a poll's nothing else is sent before the
			// stall check, seconds later: the poll is the call that waits.
			if hold == holdHealth {
				<-followed
			}
			if err := fifoLine(filepath.Join(dir, "seen"), true); err != nil {
				return err
			}
			if err := fifoLine(filepath.Join(dir, "release"), false); err != nil {
				return err
			}
		}
		if _, werr := os.Stdout.Write(line); werr != nil || err != nil {
			break
		}
	}
	return cmd.Wait()
}

// fifoLine writes a line to a FIFO, or reads one from it.
func fifoLine(path string, write bool) error {
	if write {
		f, err := os.OpenFile(path, os.O_WRONLY, 0)
		if err != nil {
			return err
		}
		_, err = f.WriteString("line\n")
		return errors.Join(err, f.Close())
	}
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = bufio.NewReader(f).ReadString('\n')
	return err
}

// hostChild is a host in a process of its own, for the tests that stop
// it. It opens the broker its environment names, with two sessions and a
// delegate in each: the asker sends the worker a task and waits on it.
// It then prints "ready <broker pid>", and waits for a line on its stdin;
// at that line the worker completes the task. Once the asker has seen it
// completed, it prints "completed <broker pid> <rejoins>" and exits.
func hostChild() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// The default health timeout (5 s): the test stops this process
	// within it of a health call. The first check while idle comes after
	// a second, not ten: the pipe tests hold its answer.
	host.SetHealthEvery(time.Second)
	cfg := host.Config{
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	cfg.Runtime.Feed.CheckInterval = 100 * time.Millisecond
	switch os.Getenv(hostBusEnv) {
	case "pipe":
		cfg.Bus = host.Pipe
		if err := json.Unmarshal([]byte(os.Getenv(hostArgsEnv)), &cfg.BrokerCommand); err != nil {
			return err
		}
	case "nats":
		cfg.Bus, cfg.ConnectionFile = host.NATS, os.Getenv(hostArgsEnv)
	default:
		return errors.New("no bus")
	}
	h, err := host.Open(ctx, cfg)
	if err != nil {
		return err
	}
	defer h.Close()
	chat1, err := h.Session(ctx, "chat-1")
	if err != nil {
		return err
	}
	defer chat1.Close()
	chat2, err := h.Session(ctx, "chat-2")
	if err != nil {
		return err
	}
	defer chat2.Close()
	asker, err := chat1.Spawn(ctx, wire.AgentCard{Name: "asker"})
	if err != nil {
		return err
	}
	worker, err := chat2.Spawn(ctx, wire.AgentCard{Name: "worker"})
	if err != nil {
		return err
	}
	task, err := asker.Send(ctx, worker.ID(), say("work across a stop of this host"), nil)
	if err != nil {
		return err
	}
	if ev, err := worker.Wait(ctx); err != nil || ev.Task == nil {
		return fmt.Errorf("the worker has no task: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- waitCompleted(ctx, asker, task.ID) }()
	fmt.Printf("ready %d\n", h.BrokerPID())
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		return err
	}
	if _, err := worker.Update(ctx, task.ID, wire.StateCompleted, &wire.Message{Parts: []wire.Part{wire.TextPart("done")}}); err != nil {
		return fmt.Errorf("the update: %w", err)
	}
	if err := <-done; err != nil {
		return err
	}
	fmt.Printf("completed %d %d\n", h.BrokerPID(), h.Rejoins())
	return nil
}

// waitCompleted waits until d hears that the task completed: its event,
// or a Resync that shows it.
func waitCompleted(ctx context.Context, d *runtime.Delegate, taskID string) error {
	for {
		ev, err := d.Wait(ctx)
		if err != nil {
			return err
		}
		if ev.Task != nil && ev.Task.TaskID == taskID && ev.Task.Final {
			if s := ev.Task.Task.Status.State; s != wire.StateCompleted {
				return fmt.Errorf("the task ended %s", s)
			}
			return nil
		}
		if ev.Resync != nil {
			for _, task := range ev.Resync.Changed {
				if task.ID == taskID && task.Status.State == wire.StateCompleted {
					return nil
				}
			}
			if len(ev.Resync.Lost) > 0 {
				return fmt.Errorf("tasks lost: %s", strings.Join(ev.Resync.Lost, ", "))
			}
		}
	}
}
