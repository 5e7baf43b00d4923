package natsbus

import (
	"crypto/sha256"
	"crypto/subtle"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/a2a-bus/a2a-bus/internal/secret"
	"github.com/a2a-bus/a2a-bus/wire"
)

// credential is one issued session credential.
type credential struct {
	user     string
	password [32]byte // sha256 of the password
	session  string
	clients  map[uint64]bool // connections that authenticated with it
}

// serveUser is the user of the broker's connections that serve sessions;
// session credentials' users are hex, so never this.
const serveUser = "a2a-bus-broker"

// Token returns the host credential. Keep it secret: it opens everything.
func (s *Server) Token() string { return s.token }

// Check implements server.Authentication.
func (s *Server) Check(c server.ClientAuthentication) bool {
	if c.Kind() != server.CLIENT {
		return false
	}
	opts := c.GetOpts()
	if opts.Token != "" {
		if subtle.ConstantTimeCompare([]byte(opts.Token), []byte(s.token)) == 1 {
			c.RegisterUser(&server.User{Username: "host"})
			return true
		}
		return false
	}
	if opts.Username == "" {
		return false
	}
	if opts.Username == serveUser {
		if subtle.ConstantTimeCompare([]byte(opts.Password), []byte(s.servePass)) == 1 {
			c.RegisterUser(&server.User{Username: serveUser, Account: s.sessions})
			return true
		}
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	cred := s.users[opts.Username]
	h := sha256.Sum256([]byte(opts.Password))
	if cred == nil || subtle.ConstantTimeCompare(cred.password[:], h[:]) != 1 {
		return false
	}
	if n := s.liveClients(cred.session); n >= s.cfg.MaxConnectionsPerSession {
		s.log.Warn("session connection refused: too many open", "session", cred.session, "limit", s.cfg.MaxConnectionsPerSession)
		return false
	}
	cred.clients[c.GetID()] = true
	c.RegisterUser(&server.User{Username: cred.user, Permissions: sessionPermissions(cred.session), Account: s.sessions})
	return true
}

// liveClients counts the open connections of a session's credentials,
// forgetting those that closed. s.mu is held.
func (s *Server) liveClients(session string) int {
	n := 0
	for _, cred := range s.bySession[session] {
		for id := range cred.clients {
			if s.ns.GetClient(id) == nil {
				delete(cred.clients, id)
				continue
			}
			n++
		}
	}
	return n
}

// sessionPermissions are what a session credential may do: request on its
// rpc subject, receive its events and its replies, answer requests it
// receives. The server enforces them.
func sessionPermissions(session string) *server.Permissions {
	return &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: []string{RPCSubject(session)}},
		Subscribe: &server.SubjectPermission{Allow: []string{EventsSubject(session), SessionInbox(session) + ".>"}},
		Response:  &server.ResponsePermission{},
	}
}

// OpenSession issues a new credential for a session.
func (s *Server) OpenSession(session string) wire.SessionCredentials {
	user, password := secret.Hex(16), secret.Hex(32)
	cred := &credential{user: user, password: sha256.Sum256([]byte(password)), session: session, clients: map[uint64]bool{}}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.users[user] = cred
	m := s.bySession[session]
	if m == nil {
		m = map[string]*credential{}
		s.bySession[session] = m
	}
	m[user] = cred
	return wire.SessionCredentials{URL: s.url, User: user, Password: password, WSURL: s.WebSocketURL()}
}

// CloseSession revokes every credential of a session and closes the
// connections made with them. A client of the session then sees its
// connection close, and its reconnects refused (authorization
// violation).
func (s *Server) CloseSession(session string) {
	s.mu.Lock()
	creds := s.bySession[session]
	delete(s.bySession, session)
	var clients []uint64
	for user, cred := range creds {
		delete(s.users, user)
		for id := range cred.clients {
			clients = append(clients, id)
		}
	}
	s.mu.Unlock()
	for _, id := range clients {
		_ = s.ns.DisconnectClientByID(id) // gone already: nothing to do
	}
}

// serveCredential returns the user and password of the broker's
// connections that serve sessions.
func (s *Server) serveCredential() (user, password string) { return serveUser, s.servePass }
