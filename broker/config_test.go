package broker_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/broker"
	"github.com/a2a-bus/a2a-bus/store"
	"github.com/a2a-bus/a2a-bus/transport/fakebus"
)

// TestANegativeConfigFieldIsRefused: the zero value and DefaultConfig
// are valid; a negative field is not (off is said by a value, never by a
// sign), nor a message limit the wire refuses, and New refuses them.
func TestANegativeConfigFieldIsRefused(t *testing.T) {
	require.NoError(t, broker.Config{}.Validate())
	require.NoError(t, broker.DefaultConfig().Validate())
	require.NoError(t, broker.Config{OrphanTimeout: broker.Forever, Retention: &store.Retention{}}.Validate())
	for name, cfg := range map[string]broker.Config{
		"MaxTasksPerContext":            {MaxTasksPerContext: -1},
		"MaxMessageBytes":               {MaxMessageBytes: -1},
		"MaxMessageBytes below 1024":    {MaxMessageBytes: 1000},
		"ReplayWindow":                  {ReplayWindow: -1},
		"MaxAgents":                     {MaxAgents: -1},
		"MaxAgentsPerSession":           {MaxAgentsPerSession: -1},
		"MaxTaskBytes":                  {MaxTaskBytes: -1},
		"ReplayBytes":                   {ReplayBytes: -1},
		"OrphanTimeout":                 {OrphanTimeout: -1},
		"Retention.MaxAge":              {Retention: &store.Retention{MaxAge: -1}},
		"Retention.MaxTerminal":         {Retention: &store.Retention{MaxTerminal: -1}},
		"Retention.MaxTerminal, MaxAge": {Retention: &store.Retention{MaxAge: time.Hour, MaxTerminal: -1}},
	} {
		t.Run(name, func(t *testing.T) {
			assert.ErrorIs(t, cfg.Validate(), broker.ErrInvalidConfig)
			bus := fakebus.New(fakebus.Config{})
			defer bus.Close()
			b, err := broker.New(context.Background(), bus, cfg)
			if err == nil {
				b.Close()
			}
			assert.ErrorIs(t, err, broker.ErrInvalidConfig)
		})
	}
}

// pruneStore tells the retention of each Prune.
type pruneStore struct {
	*store.Memory
	pruned chan store.Retention
}

func (s pruneStore) Prune(ctx context.Context, r store.Retention, now time.Time) (int, error) {
	select {
	case s.pruned <- r:
	default:
	}
	return s.Memory.Prune(ctx, r, now)
}

// TestRetentionIsTheDefaultOrWhatItSays: no Retention prunes by
// DefaultRetention; a Retention prunes by exactly its fields, a zero one
// setting no bound, as the store's do.
func TestRetentionIsTheDefaultOrWhatItSays(t *testing.T) {
	for name, tc := range map[string]struct {
		cfg  *store.Retention
		want store.Retention
	}{
		"nil":      {nil, broker.DefaultRetention},
		"age only": {&store.Retention{MaxAge: time.Hour}, store.Retention{MaxAge: time.Hour}},
		"count":    {&store.Retention{MaxTerminal: 7}, store.Retention{MaxTerminal: 7}},
	} {
		t.Run(name, func(t *testing.T) {
			st := pruneStore{Memory: store.NewMemory(), pruned: make(chan store.Retention, 1)}
			newEnv(t, broker.Config{Store: st, Retention: tc.cfg})
			assert.Equal(t, tc.want, <-st.pruned, "the first prune, at start")
		})
	}
}
