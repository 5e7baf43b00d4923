package pipebus

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"runtime"
)

// Pair returns both ends of an in-process pipe over two os.Pipes: a broker
// end and a host end, for tests, benchmarks and hosts that embed the
// broker but want the pipe's framing. Close the Client, then the Bus.
func Pair(cfg Config, ccfg ClientConfig) (*Bus, *Client, error) {
	if ccfg.MaxMessageBytes == 0 {
		ccfg.MaxMessageBytes = cfg.MaxMessageBytes
	}
	if ccfg.Logger == nil {
		ccfg.Logger = cfg.Logger
	}
	if err := ccfg.Validate(); err != nil {
		return nil, nil, err
	}
	reqR, reqW, err := os.Pipe()
	if err != nil {
		return nil, nil, err
	}
	respR, respW, err := os.Pipe()
	if err != nil {
		reqR.Close()
		reqW.Close()
		return nil, nil, err
	}
	bus, err := New(reqR, respW, cfg)
	if err != nil {
		reqR.Close()
		reqW.Close()
		respR.Close()
		respW.Close()
		return nil, nil, err
	}
	return bus, newClient(respR, reqW, nil, ccfg), nil
}

// Stdio returns the process's stdin and stdout for the broker end, as
// files or connections the runtime can interrupt, so that Close and write
// deadlines work, without changing the flags of the descriptors the
// process shares with its parent: a pipe or a terminal is opened anew
// through /proc/self/fd (Linux), a socket (as Node.js gives its children)
// becomes a net.Conn on a duplicate descriptor. A regular file is left as
// it is: its reads never block.
func Stdio(log *slog.Logger) (io.ReadCloser, io.WriteCloser) {
	return reopen(os.Stdin, selfFD(0), os.O_RDONLY, log), reopen(os.Stdout, selfFD(1), os.O_WRONLY, log)
}

// selfFD is the path that opens this process's descriptor fd anew, with
// a file description of its own: only Linux has one (/proc/self/fd).
// macOS's /dev/fd duplicates instead, sharing the flags with the parent,
// and Windows has none: there the descriptors are used as they are.
func selfFD(fd int) string {
	if runtime.GOOS != "linux" {
		return ""
	}
	return fmt.Sprintf("/proc/self/fd/%d", fd)
}

func reopen(f *os.File, path string, flag int, log *slog.Logger) io.ReadWriteCloser {
	st, err := f.Stat()
	if err != nil {
		return f
	}
	if st.Mode()&os.ModeSocket != 0 {
		c, err := net.FileConn(f)
		if err != nil {
			if log != nil {
				log.Debug("stdio socket stays blocking", "error", err)
			}
			return f
		}
		return c
	}
	if path == "" || st.Mode()&(os.ModeNamedPipe|os.ModeCharDevice) == 0 {
		// A regular file: reopening would change its offset.
		return f
	}
	g, err := os.OpenFile(path, flag, 0)
	if err != nil {
		if log != nil {
			log.Debug("stdio stays blocking", "path", path, "error", err)
		}
		return f
	}
	return g
}
