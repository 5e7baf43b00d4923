package jsstore

import (
	"encoding/base64"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// maxSubject bounds a key's subject: the server refuses a control line
// longer than 4 KiB, closing the connection, so a key is refused here
// long before. Ids, instances and send keys of wire.MaxIDBytes fit.
const maxSubject = 2048

// enc encodes one key token: base64url without padding ("=" for the
// empty string, which base64 never yields), so that any string,
// dots and wildcards included, is one valid token.
func enc(s string) string {
	if s == "" {
		return "="
	}
	return base64.RawURLEncoding.EncodeToString([]byte(s))
}

// dec decodes a token enc made.
func dec(tok string) (string, error) {
	if tok == "=" {
		return "", nil
	}
	b, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil {
		return "", fmt.Errorf("jsstore: a key token %q does not decode: %w", tok, err)
	}
	return string(b), nil
}

// Keys of the tasks bucket. Every token after the first is enc'd.
//
//	t.<id>                   the record
//	m.<instance>.r|a.<id>    member index: requester (r) or assignee (a)
//	o.<instance>.r|a.<id>    the same, only while the task is open
//	c.<session>              number of open tasks the session requested
//	e.<updatedAt ns>.<id>    terminal index, by last update (19 digits)
//	s.<instance>.<sendKey>   send index: the task id
func taskKey(id string) string         { return "t." + enc(id) }
func sessionKey(session string) string { return "c." + enc(session) }
func sendKey(instance, key string) string {
	return "s." + enc(instance) + "." + enc(key)
}
func memberKey(instance string, requester bool, id string) string {
	return "m." + enc(instance) + "." + roleTok(requester) + "." + enc(id)
}
func openKey(instance string, requester bool, id string) string {
	return "o." + enc(instance) + "." + roleTok(requester) + "." + enc(id)
}
func endedKey(updated time.Time, id string) string {
	return "e." + stamp(updated) + "." + enc(id)
}

func roleTok(requester bool) string {
	if requester {
		return "r"
	}
	return "a"
}

// stamp is t in Unix nanoseconds, 19 digits, so that keys sort by time.
func stamp(t time.Time) string { return fmt.Sprintf("%019d", nanos(t)) }

// nanos is t in Unix nanoseconds, clamped to the years 1970 to 2262.
func nanos(t time.Time) int64 {
	switch {
	case t.Before(time.Unix(0, 0)):
		return 0
	case t.After(time.Unix(0, 1<<63-1)):
		return 1<<63 - 1
	}
	return t.UnixNano()
}

// Keys of the agents bucket.
//
//	r.<instance>   the registration
//	n.<agentId>    the instance holding the name
func regKey(instance string) string { return "r." + enc(instance) }
func nameKey(agentID string) string { return "n." + enc(agentID) }

// lastToken returns the id a key ends with.
func lastToken(key string) (string, error) {
	return dec(key[strings.LastIndexByte(key, '.')+1:])
}

// endedEntry is one key of the terminal index.
type endedEntry struct {
	ns int64
	id string
}

// parseEnded parses an e.<ns>.<id> key.
func parseEnded(key string) (endedEntry, error) {
	parts := strings.Split(key, ".")
	if len(parts) != 3 || parts[0] != "e" {
		return endedEntry{}, fmt.Errorf("jsstore: %q is no terminal index key", key)
	}
	ns, err := strconv.ParseInt(parts[1], 10, 64)
	if err != nil {
		return endedEntry{}, fmt.Errorf("jsstore: terminal index key %q: %w", key, err)
	}
	id, err := dec(parts[2])
	if err != nil {
		return endedEntry{}, err
	}
	return endedEntry{ns, id}, nil
}
