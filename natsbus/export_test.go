package natsbus

// Redact is redact, for tests.
var Redact = redact

// PlainToken and B64Token are the token alphabet checks, for tests.
var (
	PlainToken = plainToken
	B64Token   = b64Token
)

// Reserves counts the closes of served session connections handled.
func (b *Bus) Reserves() int64 { return b.reserves.Load() }

// WatchdogLooks counts the watchdog's looks at the session connections.
func (s *Server) WatchdogLooks() int64 { return s.watch.Looks() }

// AllowedOrigin reports whether origin matches the patterns of list, for
// tests; it panics on a bad pattern.
func AllowedOrigin(list []string, origin string) bool {
	pats, err := parseOrigins(list)
	if err != nil {
		panic(err)
	}
	return allowedOrigin(pats, origin)
}

// WebSocketBackend is the URL of the server's own WebSocket listener,
// behind the gate.
func (s *Server) WebSocketBackend() string { return s.ns.WebsocketURL() }

// WebSocketConns counts the connections the WebSocket gate holds.
func (s *Server) WebSocketConns() int {
	s.ws.mu.Lock()
	defer s.ws.mu.Unlock()
	return len(s.ws.conns)
}
