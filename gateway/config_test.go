package gateway_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/gateway"
)

func TestConfigValidate(t *testing.T) {
	for _, c := range []struct {
		name string
		cfg  gateway.Config
		want string // "" for a valid config
	}{
		{"a token and defaults", gateway.Config{Token: "t"}, ""},
		{"every bound set", gateway.Config{Token: "t", MaxBodyBytes: 1 << 20, MaxCalls: 4, MaxInFlightBytes: 1 << 20, MaxStreamsPerClient: 1, AbandonAfter: time.Minute}, ""},
		{"never abandon", gateway.Config{Token: "t", NeverAbandon: true}, ""},
		{"no token", gateway.Config{}, "token is required"},
		{"a negative body bound", gateway.Config{Token: "t", MaxBodyBytes: -1}, "MaxBodyBytes"},
		{"negative calls", gateway.Config{Token: "t", MaxCalls: -1}, "MaxCalls"},
		{"a negative in-flight bound", gateway.Config{Token: "t", MaxInFlightBytes: -1}, "MaxInFlightBytes"},
		{"negative streams", gateway.Config{Token: "t", MaxStreamsPerClient: -1}, "MaxStreamsPerClient"},
		{"a negative abandon time is not never", gateway.Config{Token: "t", AbandonAfter: -1}, "AbandonAfter"},
		{"never abandon, and after a while", gateway.Config{Token: "t", NeverAbandon: true, AbandonAfter: time.Minute}, "choose one"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := c.cfg.Validate()
			if c.want == "" {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), c.want)
			// New refuses it before it opens a session.
			_, err = gateway.New(context.Background(), nil, c.cfg)
			assert.ErrorContains(t, err, c.want)
		})
	}
}
