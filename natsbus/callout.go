package natsbus

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/a2a-bus/a2a-bus/internal/secret"
	"github.com/a2a-bus/a2a-bus/wire"
)

// Session credentials on a server the broker does not embed, through
// NATS auth callout: the server asks the broker, on $SYS.REQ.USER.AUTH,
// whether a connecting client may in, and the broker answers with a user
// JWT signed by the issuer whose public key the server's auth_callout
// names.
//
// A credential is checked without a table, so that any broker holding
// the issuer's seed can check one another issued:
//
//	user     = <T> "." <generation, 16 hex> "." <nonce, 32 hex>
//	password = hex(HMAC-SHA256(K, "a2a-bus session credential\x00" + user))
//	K        = HMAC-SHA256(the issuer's raw seed, "a2a-bus session credentials v1")
//
// <T> names the session, the generation is the session's in Revocations
// when the credential was issued, and the credential is valid while it
// still is. The connection is admitted as the user named
// a2a-session.<T>.<generation> (calloutUserName), with the permissions
// of the embedded server's session credentials (sessionPermissions), for
// CalloutConfig.UserTTL: then the server closes it and the client's
// reconnect is checked again.

// DefaultCalloutUserTTL is how long a session connection is admitted for
// on one answer when CalloutConfig.UserTTL is 0.
const DefaultCalloutUserTTL = 5 * time.Minute

// CalloutConfig configures session credentials on a server the broker
// does not embed (Config.URL), through the server's auth callout. The
// operator configures the server with
//
//	authorization { auth_callout { issuer: <the seed's public key>,
//	    account: <the brokers' account>, auth_users: [<the brokers' users>, …] } }
//
// and gives every broker the same Seed. The zero value (no Seed) leaves
// session credentials to the operator: a2a.sessions.open is then not a
// method.
type CalloutConfig struct {
	// Seed is the issuer's account nkey seed ("SA…"). Its public key is
	// auth_callout's issuer; the broker signs its answers and the users
	// it admits with it, and derives the key of its credentials from it.
	Seed string
	// Revocations records a2a.sessions.close. Every broker of a cluster
	// must share one; nil means NewMemoryRevocations(), for a broker
	// alone on its server.
	Revocations Revocations
	// UserTTL is how long the server admits a session connection on one
	// answer; it then closes the connection, and the client's reconnect
	// is checked again. It bounds how long a revoked session's connection
	// lives where the broker cannot close it (no SystemURL). 0 means
	// DefaultCalloutUserTTL; otherwise at least a second (JWT times are
	// in seconds).
	UserTTL time.Duration
	// SystemURL reaches the same servers as a user of the system account
	// ("nats://sys:pass@host:4222"): with it, a2a.sessions.close closes
	// the session's connections on every server at once
	// ($SYS.REQ.SERVER.<id>.KICK). "" leaves them to UserTTL.
	SystemURL string
	// SystemCredsFile authenticates to SystemURL with a NATS credentials
	// file.
	SystemCredsFile string
}

// validate reports the settings New refuses, given whether the bus has
// an external server.
func (c CalloutConfig) validate(external bool) []error {
	var errs []error
	if c.Seed == "" {
		if c.SystemURL != "" || c.SystemCredsFile != "" || c.UserTTL != 0 || c.Revocations != nil {
			errs = append(errs, fmt.Errorf("%w: Callout settings without Callout.Seed", ErrBadConfig))
		}
		return errs
	}
	if !external {
		errs = append(errs, fmt.Errorf("%w: Callout is for an external server (URL); the embedded server issues its own credentials", ErrBadConfig))
	}
	if _, err := issuerKey(c.Seed); err != nil {
		errs = append(errs, err)
	}
	if c.UserTTL < 0 || (c.UserTTL > 0 && c.UserTTL < time.Second) {
		errs = append(errs, fmt.Errorf("%w: Callout.UserTTL is %v; 0 means DefaultCalloutUserTTL, otherwise at least 1s", ErrBadConfig, c.UserTTL))
	}
	if c.SystemCredsFile != "" && c.SystemURL == "" {
		errs = append(errs, fmt.Errorf("%w: Callout.SystemCredsFile without Callout.SystemURL", ErrBadConfig))
	}
	return errs
}

// CalloutIssuer returns the public key of an issuer seed (Callout.Seed):
// what every server's auth_callout names as its issuer, and what the
// brokers of one cluster must agree on.
func CalloutIssuer(seed string) (string, error) {
	kp, err := issuerKey(seed)
	if err != nil {
		return "", err
	}
	defer kp.Wipe()
	return kp.PublicKey()
}

// issuerKey reads an issuer seed: an account's.
func issuerKey(seed string) (nkeys.KeyPair, error) {
	kp, err := nkeys.FromSeed([]byte(strings.TrimSpace(seed)))
	if err != nil {
		return nil, fmt.Errorf("%w: Callout.Seed is not an nkey seed: %v", ErrBadConfig, err)
	}
	pub, err := kp.PublicKey()
	if err != nil || !nkeys.IsValidPublicAccountKey(pub) {
		kp.Wipe()
		return nil, fmt.Errorf("%w: Callout.Seed is not an account's seed (SA…): auth_callout's issuer is an account key", ErrBadConfig)
	}
	return kp, nil
}

// callout answers the server's auth callout and issues the credentials
// it admits.
type callout struct {
	kp      nkeys.KeyPair
	issuer  string // kp's public key
	key     []byte // K: the passwords' HMAC key
	revs    Revocations
	ttl     time.Duration
	account string // where session connections are placed: the broker's own account
	url     string // given in credentials, without user info
	sys     *nats.Conn
	log     *slog.Logger

	slots chan struct{}  // bounds the requests answered at once
	wg    sync.WaitGroup // the answers under way
	xkey  sync.Once      // the warning about encrypted requests, once

	mu      sync.Mutex
	sub     *nats.Subscription
	stopped bool
}

// calloutSlots bounds the auth requests a broker answers at once; past
// it the subscription waits (the server's auth timeout bounds the wait).
const calloutSlots = 64

// newCallout sets up the auth callout for a bus connected on nc: it asks
// the server which account nc is in, and connects to the system account
// if cfg says how.
func newCallout(cfg Config, nc *nats.Conn) (*callout, error) {
	kp, err := issuerKey(cfg.Callout.Seed)
	if err != nil {
		return nil, err
	}
	pub, _ := kp.PublicKey()
	_, raw, err := nkeys.DecodeSeed([]byte(strings.TrimSpace(cfg.Callout.Seed)))
	if err != nil {
		return nil, fmt.Errorf("%w: Callout.Seed: %v", ErrBadConfig, err)
	}
	mac := hmac.New(sha256.New, raw)
	mac.Write([]byte("a2a-bus session credentials v1"))
	c := &callout{kp: kp, issuer: pub, key: mac.Sum(nil), revs: cfg.Callout.Revocations, ttl: cfg.Callout.UserTTL,
		url: redact(cfg.URL), log: cfg.Logger, slots: make(chan struct{}, calloutSlots)}
	if c.revs == nil {
		c.revs = NewMemoryRevocations()
	}
	if c.ttl == 0 {
		c.ttl = DefaultCalloutUserTTL
	}
	if c.account, err = ownAccount(nc); err != nil {
		return nil, err
	}
	if cfg.Callout.SystemURL != "" {
		opts := []nats.Option{nats.Name("a2a-bus broker: system"), nats.MaxReconnects(-1),
			nats.CustomReconnectDelay(reconnectDelay), nats.PingInterval(pingInterval), nats.MaxPingsOutstanding(maxPingsOut)}
		if cfg.Callout.SystemCredsFile != "" {
			opts = append(opts, nats.UserCredentials(cfg.Callout.SystemCredsFile))
		}
		if c.sys, err = nats.Connect(cfg.Callout.SystemURL, opts...); err != nil {
			return nil, fmt.Errorf("natsbus: connect to the system account at %s: %w", redact(cfg.Callout.SystemURL), err)
		}
	}
	return c, nil
}

// ownAccount asks the server which account nc is in
// ($SYS.REQ.USER.INFO, which every account imports).
func ownAccount(nc *nats.Conn) (string, error) {
	msg, err := nc.Request("$SYS.REQ.USER.INFO", nil, 5*time.Second)
	if err != nil {
		return "", fmt.Errorf("natsbus: auth callout: ask the server for the broker's account ($SYS.REQ.USER.INFO): %w", err)
	}
	var resp struct {
		Data  *server.UserInfo `json:"data"`
		Error *server.ApiError `json:"error"`
	}
	if err := json.Unmarshal(msg.Data, &resp); err != nil || resp.Data == nil || resp.Data.Account == "" {
		if resp.Error != nil {
			return "", fmt.Errorf("natsbus: auth callout: the broker's account: %s", resp.Error.Description)
		}
		return "", fmt.Errorf("natsbus: auth callout: the server's answer to $SYS.REQ.USER.INFO names no account")
	}
	return resp.Data.Account, nil
}

// serve answers the server's auth requests on nc, in queue when it is
// not empty.
func (c *callout) serve(nc *nats.Conn, queue string) error {
	sub, err := nc.QueueSubscribe(server.AuthCalloutSubject, queue, func(m *nats.Msg) {
		c.mu.Lock()
		if c.stopped {
			c.mu.Unlock()
			return // another broker of the group answers, or none: refused
		}
		c.wg.Add(1)
		c.mu.Unlock()
		c.slots <- struct{}{}
		go func() {
			defer c.wg.Done()
			defer func() { <-c.slots }()
			c.answer(m)
		}()
	})
	if err != nil {
		return fmt.Errorf("natsbus: subscribe %s: %w", server.AuthCalloutSubject, err)
	}
	c.mu.Lock()
	c.sub = sub
	c.mu.Unlock()
	return nil
}

// close stops answering, waits for the answers under way, and closes the
// system connection. Idempotent.
func (c *callout) close() {
	c.mu.Lock()
	sub := c.sub
	c.sub, c.stopped = nil, true
	c.mu.Unlock()
	if sub != nil {
		_ = sub.Unsubscribe()
	}
	c.wg.Wait()
	if c.sys != nil {
		c.sys.Close()
	}
	c.kp.Wipe()
}

// answer answers one auth request: a user JWT for a valid session
// credential, a refusal for anything else. A request it cannot read
// is not answered (the server refuses the client at its auth timeout).
func (c *callout) answer(m *nats.Msg) {
	if m.Reply == "" {
		return
	}
	if m.Header.Get(server.AuthRequestXKeyHeader) != "" {
		c.xkey.Do(func() {
			c.log.Error("the server encrypts its auth callout requests (xkey): leave xkey out of auth_callout; no session can connect meanwhile")
		})
		return
	}
	req, err := jwt.DecodeAuthorizationRequestClaims(string(m.Data))
	if err != nil || !nkeys.IsValidPublicServerKey(req.Issuer) || !nkeys.IsValidPublicUserKey(req.UserNkey) {
		c.log.Debug("auth callout: a request that is not a server's ignored", "error", err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), calloutWait(req.Expires))
	defer cancel()
	user, refusal := c.admit(ctx, req)
	resp := jwt.NewAuthorizationResponseClaims(req.UserNkey)
	resp.Audience = req.Server.ID
	resp.Jwt, resp.Error = user, refusal
	tok, err := resp.Encode(c.kp)
	if err != nil {
		c.log.Error("auth callout: sign the answer", "error", err)
		return
	}
	if err := m.Respond([]byte(tok)); err != nil {
		c.log.Warn("auth callout: answer", "error", err)
	}
}

// calloutWait is how long an answer may take: until the request expires
// (the server's auth timeout), within bounds.
func calloutWait(expires int64) time.Duration {
	d := time.Until(time.Unix(expires, 0))
	return min(max(d, 500*time.Millisecond), 10*time.Second)
}

// admit returns the user JWT for the client of req, or why it is
// refused.
func (c *callout) admit(ctx context.Context, req *jwt.AuthorizationRequestClaims) (string, string) {
	if req.ClientInformation.Kind != "Client" {
		return "", "only clients hold session credentials"
	}
	opts := req.ConnectOptions
	session, gen, ok := c.check(opts.Username, opts.Password)
	if !ok {
		c.log.Debug("auth callout: refused: not a session credential", "host", req.ClientInformation.Host)
		return "", "not a session credential"
	}
	current, err := c.revs.Current(ctx, session)
	if err != nil {
		c.log.Warn("auth callout: refused: the session's generation could not be read", "session", session, "error", err)
		return "", "the session's credentials cannot be checked now"
	}
	if current != gen {
		c.log.Debug("auth callout: refused: revoked", "session", session)
		return "", "the session's credential was revoked"
	}
	uc := jwt.NewUserClaims(req.UserNkey)
	uc.Name = calloutUserName(session, gen)
	uc.Audience = c.account // where the server places the user (config mode)
	perms := sessionPermissions(session)
	uc.Pub.Allow.Add(perms.Publish.Allow...)
	uc.Sub.Allow.Add(perms.Subscribe.Allow...)
	uc.Resp = &jwt.ResponsePermission{} // the server's defaults, as the embedded server's
	uc.Limits.Subs = DefaultMaxSubscriptions
	uc.AllowedConnectionTypes.Add(jwt.ConnectionTypeStandard, jwt.ConnectionTypeWebsocket)
	uc.Expires = int64(math.Ceil(float64(time.Now().Add(c.ttl).UnixNano()) / 1e9))
	tok, err := uc.Encode(c.kp)
	if err != nil {
		c.log.Error("auth callout: sign a user", "error", err)
		return "", "the broker could not sign the user"
	}
	return tok, ""
}

// calloutUserName is the name a session connection is admitted under:
// the session and the generation of its credential, so that the
// connections of a revoked generation can be found on every server.
func calloutUserName(session string, gen uint64) string {
	return "a2a-session." + SubjectToken(session) + "." + genHex(gen)
}

func genHex(gen uint64) string { return fmt.Sprintf("%016x", gen) }

// issue returns a new credential for the session.
func (c *callout) issue(ctx context.Context, session string) (wire.SessionCredentials, error) {
	gen, err := c.revs.Current(ctx, session)
	if err != nil {
		return wire.SessionCredentials{}, fmt.Errorf("natsbus: the session's credential generation: %w", err)
	}
	user := SubjectToken(session) + "." + genHex(gen) + "." + secret.Hex(16)
	return wire.SessionCredentials{URL: c.url, User: user, Password: c.password(user)}, nil
}

func (c *callout) password(user string) string {
	mac := hmac.New(sha256.New, c.key)
	mac.Write([]byte("a2a-bus session credential\x00"))
	mac.Write([]byte(user))
	return hex.EncodeToString(mac.Sum(nil))
}

// check returns the session and generation of a credential this issuer
// issued; ok is false for anything else.
func (c *callout) check(user, password string) (session string, gen uint64, ok bool) {
	rest, nonce, ok1 := cutLast(user)
	token, g, ok2 := cutLast(rest)
	if !ok1 || !ok2 || len(nonce) != 32 || len(g) != 16 || !isHex(nonce) || !isHex(g) {
		return "", 0, false
	}
	if subtle.ConstantTimeCompare([]byte(password), []byte(c.password(user))) != 1 {
		return "", 0, false
	}
	session, err := SessionID(token)
	if err != nil {
		return "", 0, false
	}
	gen, err = strconv.ParseUint(g, 16, 64)
	if err != nil {
		return "", 0, false
	}
	return session, gen, true
}

// cutLast cuts s around its last ".".
func cutLast(s string) (before, after string, ok bool) {
	i := strings.LastIndexByte(s, '.')
	if i < 0 {
		return "", "", false
	}
	return s[:i], s[i+1:], true
}

func isHex(s string) bool {
	for i := 0; i < len(s); i++ {
		if !('0' <= s[i] && s[i] <= '9' || 'a' <= s[i] && s[i] <= 'f') {
			return false
		}
	}
	return true
}

// revoke revokes the session's credentials cluster-wide, then closes the
// connections admitted with them on every server it can reach.
func (c *callout) revoke(ctx context.Context, session string) error {
	ended, err := c.revs.Revoke(ctx, session)
	if err != nil {
		return fmt.Errorf("natsbus: revoke the session's credentials: %w", err)
	}
	if c.sys == nil {
		return nil // they end with their user JWT, within UserTTL
	}
	if err := c.kick(ctx, calloutUserName(session, ended)); err != nil {
		// Revoked all the same: what was not closed ends within UserTTL.
		c.log.Warn("closing a revoked session's connections", "session", session, "error", err)
	}
	return nil
}

// How long kick waits for the servers' answers to its connz request:
// the first within connzFirst, each next within connzQuiet of the one
// before (the number of servers is not known in advance).
const (
	connzFirst = 2 * time.Second
	connzQuiet = 250 * time.Millisecond
)

// kickLimit bounds the connections of one session generation kick
// closes per server (the callout does not count a session's
// connections); any beyond end with their user JWT.
const kickLimit = 1024

// kick closes, on every server that answers, the connections admitted
// under user in the broker's account.
func (c *callout) kick(ctx context.Context, user string) error {
	body, _ := json.Marshal(server.ConnzOptions{Username: true, User: user, Account: c.account, Limit: kickLimit})
	inbox := c.sys.NewInbox()
	sub, err := c.sys.SubscribeSync(inbox)
	if err != nil {
		return err
	}
	defer sub.Unsubscribe()
	if err := c.sys.PublishRequest("$SYS.REQ.SERVER.PING.CONNZ", inbox, body); err != nil {
		return err
	}
	type target struct {
		server string
		cid    uint64
	}
	var targets []target
	for wait := connzFirst; ; wait = connzQuiet {
		wctx, cancel := context.WithTimeout(ctx, wait)
		msg, err := sub.NextMsgWithContext(wctx)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			break // no more answers
		}
		var resp struct {
			Server *server.ServerInfo `json:"server"`
			Data   *server.Connz      `json:"data"`
			Error  *server.ApiError   `json:"error"`
		}
		if err := json.Unmarshal(msg.Data, &resp); err != nil || resp.Server == nil || resp.Data == nil {
			c.log.Warn("a server's connz answer unread", "error", err)
			continue
		}
		for _, ci := range resp.Data.Conns {
			targets = append(targets, target{resp.Server.ID, ci.Cid})
		}
	}
	var errs []error
	for _, t := range targets {
		body, _ := json.Marshal(server.KickClientReq{CID: t.cid})
		msg, err := c.sys.RequestWithContext(ctx, "$SYS.REQ.SERVER."+t.server+".KICK", body)
		if err != nil {
			errs = append(errs, fmt.Errorf("kick client %d on %s: %w", t.cid, t.server, err))
			continue
		}
		var resp struct {
			Error *server.ApiError `json:"error"`
		}
		if json.Unmarshal(msg.Data, &resp) == nil && resp.Error != nil {
			errs = append(errs, fmt.Errorf("kick client %d on %s: %s", t.cid, t.server, resp.Error.Description))
		}
	}
	return errors.Join(errs...)
}
