//go:build unix

package pipebus_test

import (
	"bufio"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/internal/testbin"
)

// TestSignalStopsABrokerOnASocket: a host that gives the broker a socket
// pair as stdio (as Node.js does) can still stop it with SIGTERM.
func TestSignalStopsABrokerOnASocket(t *testing.T) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	require.NoError(t, err)
	host, child := os.NewFile(uintptr(fds[0]), "host"), os.NewFile(uintptr(fds[1]), "child")
	defer host.Close()
	cmd := exec.Command(testbin.A2ABus(t), "serve", "--bus=pipe", "--data-dir=")
	cmd.Stdin, cmd.Stdout = child, child
	stderr := &lockedBuffer{}
	cmd.Stderr = stderr
	require.NoError(t, cmd.Start())
	child.Close()
	_, err = host.Write([]byte(`{"jsonrpc":"2.0","id":1,"method":"a2a.agents.register","params":{"contextId":"s1","card":{"name":"a"}}}` + "\n"))
	require.NoError(t, err)
	line, err := bufio.NewReader(host).ReadString('\n')
	require.NoError(t, err)
	require.Contains(t, line, `"result"`)
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		assert.NoError(t, err, "exit 0; stderr: %s", stderr.String())
	case <-time.After(10 * time.Second):
		cmd.Process.Kill()
		<-done
		t.Fatal("the broker ignored SIGTERM on a socket")
	}
}
