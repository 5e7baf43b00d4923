package natsbus_test

import (
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/natsbus"
)

func TestSubjectToken(t *testing.T) {
	tests := []struct{ id, token string }{
		{"chat-1", "chat-1"},
		{"A_b-9", "A_b-9"},
		{strings.Repeat("a", 128), strings.Repeat("a", 128)},
		{strings.Repeat("a", 129), "~" + strings.Repeat("YWFh", 43)},
		{"a.b", "~YS5i"},
		{"a*b", "~YSpi"},
		{"a>b", "~YT5i"},
		{"a b", "~YSBi"},
		{"ünï", "~w7xuw68"},
		{"~x", "~fng"},
		{"$SYS", "~JFNZUw"},
	}
	for _, tc := range tests {
		t.Run(tc.id, func(t *testing.T) {
			tok := natsbus.SubjectToken(tc.id)
			assert.Equal(t, tc.token, tok)
			back, err := natsbus.SessionID(tok)
			require.NoError(t, err)
			assert.Equal(t, tc.id, back)
			assert.True(t, server.IsValidLiteralSubject(natsbus.EventsSubject(tc.id)), natsbus.EventsSubject(tc.id))
			assert.True(t, server.IsValidLiteralSubject(natsbus.RPCSubject(tc.id)))
		})
	}
}

func TestSessionIDRefusesNonCanonicalTokens(t *testing.T) {
	for _, tok := range []string{
		"", "~", "~YWJj", // "abc" has a plain form
		"~YS5i=", // padding
		"~YS5",   // non-zero trailing bits would decode, leniently, to "a."
		"~/+8",   // standard, not url, alphabet
		"~_w",    // 0xff: not UTF-8
		"a.b", "*", ">", "a b",
		strings.Repeat("a", 129),
	} {
		_, err := natsbus.SessionID(tok)
		assert.ErrorIs(t, err, natsbus.ErrBadToken, "%q", tok)
	}
}

// FuzzSubjectToken checks that the mapping round-trips, is one-to-one, and
// always yields one valid subject token.
func FuzzSubjectToken(f *testing.F) {
	for _, s := range []string{"chat-1", "a.b", "ünï", "~", "", strings.Repeat("z", 129), "a b>*"} {
		f.Add(s, "~"+s)
	}
	f.Fuzz(func(t *testing.T, id, other string) {
		if !utf8.ValidString(id) || id == "" {
			return
		}
		tok := natsbus.SubjectToken(id)
		if strings.ContainsAny(tok, ". *>\t\r\n") || !server.IsValidLiteralSubject("a2a.rpc."+tok) {
			t.Fatalf("token %q of %q is not one subject token", tok, id)
		}
		back, err := natsbus.SessionID(tok)
		if err != nil || back != id {
			t.Fatalf("round trip of %q: %q, %v", id, back, err)
		}
		// One-to-one: a token that decodes maps back to itself.
		if got, err := natsbus.SessionID(other); err == nil {
			if natsbus.SubjectToken(got) != other {
				t.Fatalf("token %q decodes to %q, whose token is %q", other, got, natsbus.SubjectToken(got))
			}
			if (got == id) != (other == tok) {
				t.Fatalf("two tokens for one id: %q and %q -> %q", tok, other, id)
			}
		}
	})
}

// FuzzTokenCharsMatchTheRegexp: the loops accept exactly what the
// documented patterns do.
func FuzzTokenCharsMatchTheRegexp(f *testing.F) {
	plain := regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`)
	b64 := regexp.MustCompile(`^~[A-Za-z0-9_-]+$`)
	for _, s := range []string{"", "a", "~", "~a", "chat-1", "a b", "~YQ", strings.Repeat("x", 129), "é", "a\n"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if natsbus.PlainToken(s) != plain.MatchString(s) || natsbus.B64Token(s) != b64.MatchString(s) {
			t.Fatalf("%q: plain %v/%v, b64 %v/%v", s, natsbus.PlainToken(s), plain.MatchString(s), natsbus.B64Token(s), b64.MatchString(s))
		}
	})
}
