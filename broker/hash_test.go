package broker_test

import (
	"crypto/sha256"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/a2a-bus/a2a-bus/broker"
	"github.com/a2a-bus/a2a-bus/internal/secret"
)

// TestHashingATokenAllocatesNothing: every call hashes its token to find
// its agent; a token as the broker mints it is hashed without touching
// the heap, and any token hashes as SHA-256 does.
func TestHashingATokenAllocatesNothing(t *testing.T) {
	token := secret.Hex(32) // as register mints it
	assert.Zero(t, testing.AllocsPerRun(100, func() { broker.HashToken(token) }))
	for _, tok := range []string{"", token, strings.Repeat("x", 128), strings.Repeat("y", 129), strings.Repeat("z", 4096)} {
		assert.Equal(t, sha256.Sum256([]byte(tok)), broker.HashToken(tok), "a token of %d bytes", len(tok))
	}
}
