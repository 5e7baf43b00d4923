package runtime_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/runtime"
	"github.com/a2a-bus/a2a-bus/wire"
)

// Peer is one card of Peers, by agentId: nil for one Peers would not
// list (unknown, the delegate itself).
func TestPeerIsOneCardOfPeers(t *testing.T) {
	rts := fakeRuntimes(t, runtime.Config{}, "s1", "s2")
	a, err := rts[0].Spawn(ctxT(t), wire.AgentCard{Name: "scribe", Description: "takes notes"})
	require.NoError(t, err)
	b, err := rts[1].Spawn(ctxT(t), wire.AgentCard{Name: "critic"})
	require.NoError(t, err)

	peers, err := b.Peers(ctxT(t))
	require.NoError(t, err)
	require.Len(t, peers, 1)
	c, err := b.Peer(ctxT(t), a.ID())
	require.NoError(t, err)
	require.NotNil(t, c)
	assert.Equal(t, peers[0], *c)

	for _, id := range []string{"nobody", b.ID(), ""} {
		c, err := b.Peer(ctxT(t), id)
		require.NoError(t, err)
		assert.Nil(t, c, "agentId %q", id)
	}
	require.NoError(t, a.Settle(ctxT(t)))
	c, err = b.Peer(ctxT(t), a.ID())
	require.NoError(t, err)
	assert.Nil(t, c, "a settled delegate is gone")
}
