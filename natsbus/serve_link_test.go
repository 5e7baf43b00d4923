package natsbus

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/transport"
	"github.com/a2a-bus/a2a-bus/wire"
)

// pieces reads its data in pieces of random sizes, as a pipe hands over
// what its writer wrote in as many reads as the reader's buffer takes.
type pieces struct {
	data []byte
	rnd  *rand.Rand
}

func (p *pieces) Read(b []byte) (int, error) {
	if len(p.data) == 0 {
		return 0, io.EOF
	}
	n := min(len(b), len(p.data), 1+p.rnd.IntN(3000))
	copy(b, p.data[:n])
	p.data = p.data[n:]
	return n, nil
}

// TestALinkReadsLinesAndPayloadsWhateverTheirPieces: the link's reader
// returns each line and payload whole whatever the pieces they come in,
// lines longer than its buffer and payloads many times its size
// included; its buffer grows while reads fill it and goes back to its
// smallest once a session is idle again.
func TestALinkReadsLinesAndPayloadsWhateverTheirPieces(t *testing.T) {
	info := "INFO " + `{"server_id":"` + strings.Repeat("x", 3*linkBufMin) + `"}`
	big := bytes.Repeat([]byte("0123456789"), 30_000)
	var stream bytes.Buffer
	stream.WriteString(info + "\r\n")
	for i := range 200 {
		fmt.Fprintf(&stream, "MSG a2a.rpc.s1 1 _INBOX.s1.%d 5\r\nhello\r\n", i)
	}
	stream.WriteString("MSG a2a.rpc.s1 1 300000\r\n")
	stream.Write(big)
	stream.WriteString("\r\nPING\r\n")
	for seed := range uint64(20) {
		r := &linkReader{r: &pieces{data: bytes.Clone(stream.Bytes()), rnd: rand.New(rand.NewPCG(seed, 1))}}
		line, err := r.line()
		require.NoError(t, err)
		require.Equal(t, info, string(line))
		for range 200 {
			line, err = r.line()
			require.NoError(t, err)
			require.True(t, strings.HasPrefix(string(line), "MSG a2a.rpc.s1 1 _INBOX.s1."), "seed %d: %q", seed, line)
			p := make([]byte, 7)
			require.NoError(t, r.full(p))
			require.Equal(t, "hello\r\n", string(p))
		}
		line, err = r.line()
		require.NoError(t, err)
		require.Equal(t, "MSG a2a.rpc.s1 1 300000", string(line))
		p := make([]byte, len(big)+2)
		require.NoError(t, r.full(p))
		require.Equal(t, big, p[:len(big)], "seed %d", seed)
		line, err = r.line()
		require.NoError(t, err)
		require.Equal(t, "PING", string(line))
		_, err = r.line()
		require.ErrorIs(t, err, io.EOF)
	}

	// Reads that fill the buffer grow it; short ones, then an empty
	// buffer, bring it back to its smallest.
	full := &pieces{data: bytes.Repeat([]byte("PING\r\n"), 10_000), rnd: rand.New(rand.NewPCG(1, 1))}
	r := &linkReader{r: readFull{full}}
	for range 10_000 {
		_, err := r.line()
		require.NoError(t, err)
	}
	assert.Greater(t, len(r.buf), linkBufMin, "reads that filled it grew it")
	r.r = &oneLine{r: strings.NewReader("PING\r\nPING\r\nPING\r\n")}
	for range 3 {
		_, err := r.line()
		require.NoError(t, err)
	}
	assert.Equal(t, linkBufMin, len(r.buf), "an idle link's buffer is small again")
}

// readFull fills every read it is given, as a busy pipe does.
type readFull struct{ r io.Reader }

func (f readFull) Read(b []byte) (int, error) { return io.ReadFull(f.r, b) }

// oneLine returns one line a read, as an idle session's pings come.
type oneLine struct{ r io.Reader }

func (o *oneLine) Read(b []byte) (int, error) { return o.r.Read(b[:min(len(b), len("PING\r\n"))]) }

// echoSessions serves a2a.sessions.open, and answers a session's request
// with its params, or with params.size bytes when it has that.
func echoSessions(t *testing.T, b *Bus) {
	t.Helper()
	open := b.HostMethods()[wire.MethodSessionOpen]
	require.NoError(t, b.Serve(transport.HandlerFunc(func(ctx context.Context, from transport.Caller, raw []byte) []byte {
		req, err := wire.ParseRequest(raw, 0)
		if err != nil {
			return nil
		}
		if from.Scope == transport.ScopeHost {
			res, err := open(ctx, req.Params)
			if err != nil {
				return wire.ErrorResponse(req.ID, wire.ErrInternal.Withf("%v", err))
			}
			resp, _ := wire.EncodeResult(req.ID, res)
			return resp
		}
		var p struct{ Size int }
		_ = json.Unmarshal(req.Params, &p)
		if p.Size > 0 {
			resp, _ := wire.EncodeResult(req.ID, strings.Repeat("y", p.Size))
			return resp
		}
		resp, _ := wire.EncodeResult(req.ID, req.Params)
		return resp
	})))
}

// dialSessionCredential opens session with the host token and connects a
// client with its credential, over TCP.
func dialSessionCredential(t *testing.T, b *Bus, session string) transport.Session {
	t.Helper()
	host, err := b.Connect(ClientConfig{})
	require.NoError(t, err)
	defer host.Close()
	raw, err := host.CallHost(testCtx(t), wire.MethodSessionOpen, wire.SessionParams{ContextID: session})
	require.NoError(t, err)
	var cred wire.SessionCredentials
	require.NoError(t, json.Unmarshal(raw, &cred))
	c, err := Dial(ClientConfig{URL: cred.URL, User: cred.User, Password: cred.Password, Session: session})
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	s, err := c.Session(testCtx(t), session)
	require.NoError(t, err)
	return s
}

// TestASessionsLinkCarriesWhatThePayloadLimitAllows: on a session's own
// link, requests of up to the message limit and answers of up to the
// payload limit, many times its read buffer, go through whole; an answer
// over the limit is an error the caller receives.
func TestASessionsLinkCarriesWhatThePayloadLimitAllows(t *testing.T) {
	b, err := New(Config{CloseGrace: 50 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() { b.Close() })
	echoSessions(t, b)
	s := dialSessionCredential(t, b, "s1")
	for _, size := range []int{1, linkBufMin, 10 * linkBufMax, wire.DefaultMaxMessageBytes - 1024} {
		param := strings.Repeat("z", size)
		res, err := s.Call(testCtx(t), "echo", param)
		require.NoError(t, err, "a request of %d bytes", size)
		var got string
		require.NoError(t, json.Unmarshal(res, &got))
		require.Equal(t, param, got, "the answer to a request of %d bytes", size)
	}
	size := b.MaxPayload() - 1024
	res, err := s.Call(testCtx(t), "big", map[string]int{"size": size})
	require.NoError(t, err, "an answer of %d bytes", size)
	assert.Len(t, res, size+2)
	_, err = s.Call(testCtx(t), "big", map[string]int{"size": b.MaxPayload()})
	var rpcErr *wire.Error
	require.ErrorAs(t, err, &rpcErr)
	assert.Contains(t, rpcErr.Message, "over the server's payload limit")
}

// TestASessionsLinkTheServerClosesIsMadeAgain: when the server closes
// the broker's link serving a session (as it closes a slow consumer),
// the broker makes it again, and the session's requests are served.
func TestASessionsLinkTheServerClosesIsMadeAgain(t *testing.T) {
	b, err := New(Config{CloseGrace: 50 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() { b.Close() })
	echoSessions(t, b)
	s := dialSessionCredential(t, b, "s1")
	_, err = s.Call(testCtx(t), "echo", "before")
	require.NoError(t, err)
	b.mu.Lock()
	first := b.served["s1"].link
	b.mu.Unlock()

	cz, err := b.server.ns.Connz(&server.ConnzOptions{Account: sessionsAccount, Limit: 1 << 20})
	require.NoError(t, err)
	var cid uint64
	for _, c := range cz.Conns {
		if c.Name == "a2a-bus broker: s1" {
			cid = c.Cid
		}
	}
	require.NotZero(t, cid, "the session's link is a connection of the sessions account")
	require.NoError(t, b.server.ns.DisconnectClientByID(cid))
	require.Eventually(t, func() bool { return b.Reserves() == 1 }, 10*time.Second, 10*time.Millisecond, "the closed link is handled")
	b.mu.Lock()
	again := b.served["s1"]
	b.mu.Unlock()
	require.NotNil(t, again, "the session is served anew")
	assert.NotSame(t, first, again.link)
	res, err := s.Call(testCtx(t), "echo", "after")
	require.NoError(t, err)
	assert.JSONEq(t, `"after"`, string(res))
}

// fuzzConn is a connection whose reads come from pieces and whose writes
// go nowhere: all that serving a link reads and writes.
type fuzzConn struct {
	net.Conn
	r io.Reader
}

func (c fuzzConn) Read(b []byte) (int, error)  { return c.r.Read(b) }
func (c fuzzConn) Write(b []byte) (int, error) { return len(b), nil }
func (c fuzzConn) Close() error                { return nil }

// FuzzALinkServesWhatTheServerSends: whatever bytes come from the server,
// in whatever pieces, the link hands on only whole messages within the
// payload limit, each with the payload its MSG line announced, and ends
// with an error instead of a panic or a hang. The seeds are a server's
// ordinary traffic.
func FuzzALinkServesWhatTheServerSends(f *testing.F) {
	f.Add([]byte("MSG a2a.rpc.s1 1 _INBOX.s1.x 5\r\nhello\r\nPING\r\nPONG\r\nMSG a 1 0\r\n\r\n"), uint64(1))
	f.Add([]byte("INFO {}\r\n+OK\r\nMSG a 1 r 3\r\nabc\r\n-ERR 'Slow Consumer'\r\n"), uint64(2))
	f.Add([]byte("MSG a 1 r 2000\r\n"+strings.Repeat("x", 2000)+"\r\n"), uint64(3))
	f.Add([]byte("MSG a 1 r -1\r\nMSG  \r\n"), uint64(4))
	const limit = 1024
	f.Fuzz(func(t *testing.T, data []byte, seed uint64) {
		l := &sessionLink{payload: limit, done: make(chan struct{})}
		in := &pieces{data: data, rnd: rand.New(rand.NewPCG(seed, seed))}
		l.conn = fuzzConn{r: in}
		l.rd.r = in
		var got []inbound
		l.handle = func(m inbound) { got = append(got, m) }
		err := l.serve()
		require.Error(t, err, "a finite stream ends with an error")
		for _, m := range got {
			require.LessOrEqual(t, len(m.data), limit)
			// What the payload was announced as is what was handed on.
			i := bytes.Index(data, []byte(m.subject))
			require.GreaterOrEqual(t, i, 0, "a subject that was not sent: %q", m.subject)
		}
	})
}
