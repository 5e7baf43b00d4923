package runtime_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/runtime"
)

func TestConfigValidate(t *testing.T) {
	for _, c := range []struct {
		name string
		cfg  runtime.Config
		want string // "" for a valid config
	}{
		{"the zero value", runtime.Config{}, ""},
		{"the default retry spelled out", runtime.Config{Queue: 10, Retry: runtime.DefaultRetry}, ""},
		{"no retry", runtime.Config{Retry: runtime.Retry{Attempts: 1}}, ""},
		{"the same wait every time", runtime.Config{Retry: runtime.Retry{Attempts: 4, Backoff: time.Millisecond}}, ""},
		{"a negative queue", runtime.Config{Queue: -1}, "Config.Queue"},
		{"a negative call timeout", runtime.Config{CallTimeout: -time.Second}, "Config.CallTimeout"},
		{"a retry of no attempt", runtime.Config{Retry: runtime.Retry{Backoff: time.Second}}, "Retry.Attempts"},
		{"a negative backoff", runtime.Config{Retry: runtime.Retry{Attempts: 2, Backoff: -time.Second}}, "backoff is negative"},
		{"a cap below the first wait", runtime.Config{Retry: runtime.Retry{Attempts: 2, Backoff: time.Second, MaxBackoff: time.Millisecond}}, "MaxBackoff"},
		{"a negative check interval", runtime.Config{Feed: runtime.FeedConfig{CheckInterval: -1}}, "CheckInterval"},
		{"a negative replay timeout", runtime.Config{Feed: runtime.FeedConfig{ReplayTimeout: -time.Second}}, "ReplayTimeout"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := c.cfg.Validate()
			if c.want == "" {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), c.want)
			// New and NewFeed refuse it before they touch the session.
			_, err = runtime.New(context.Background(), nil, c.cfg)
			assert.ErrorContains(t, err, c.want)
			if c.cfg.Feed.Validate() != nil {
				_, err = runtime.NewFeed(context.Background(), nil, c.cfg.Feed)
				assert.ErrorContains(t, err, c.want)
			}
		})
	}
}
