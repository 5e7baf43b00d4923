package natsbus

import (
	"errors"
	"math"
	"reflect"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"
)

// TestValidate: the zero values are valid (each field's default), and
// every setting out of its range is ErrBadConfig, naming the setting,
// from Validate and from the constructor that takes it, before anything
// starts.
func TestValidate(t *testing.T) {
	t.Run("zero values are the defaults", func(t *testing.T) {
		assert.NoError(t, Config{}.Validate())
		assert.NoError(t, ServerConfig{}.Validate())
		assert.NoError(t, ClientConfig{}.Validate())
		assert.NoError(t, Config{SessionRate: NoSessionRate}.Validate())
		assert.NoError(t, Config{SessionRate: math.Inf(1)}.Validate())
		assert.NoError(t, Config{MaxMessageBytes: 4096, Server: ServerConfig{MaxMessageBytes: 4096}}.Validate())
		assert.NoError(t, Config{URL: "nats://127.0.0.1:4222", CredsFile: "x.creds"}.Validate())
		assert.NoError(t, ClientConfig{User: "u", Password: "p", Session: "s"}.Validate())
	})
	for _, tc := range []struct {
		name    string
		cfg     Config
		setting string
	}{
		{"a negative message limit", Config{MaxMessageBytes: -1}, "MaxMessageBytes"},
		{"a message limit under wire's least", Config{MaxMessageBytes: 100}, "MaxMessageBytes"},
		{"a negative in-flight bound", Config{MaxInFlight: -1}, "MaxInFlight"},
		{"a negative per-session in-flight bound", Config{MaxInFlightPerSession: -1}, "MaxInFlightPerSession"},
		{"a negative waiting bound", Config{MaxWaitingPerSession: -1}, "MaxWaitingPerSession"},
		{"a negative rate, once a sign for no bound", Config{SessionRate: -1}, "SessionRate"},
		{"a rate that is not a number", Config{SessionRate: math.NaN()}, "SessionRate"},
		{"a negative grace", Config{CloseGrace: -time.Second}, "CloseGrace"},
		{"a server message limit of its own", Config{Server: ServerConfig{MaxMessageBytes: 4096}}, "Server.MaxMessageBytes"},
		{"a credentials file without a URL", Config{CredsFile: "x.creds"}, "CredsFile"},
		{"a negative server bound", Config{Server: ServerConfig{MaxSessionPending: -1}}, "MaxSessionPending"},
		{"a negative connection bound", Config{Server: ServerConfig{MaxConnectionsPerSession: -1}}, "MaxConnectionsPerSession"},
		{"a negative start timeout", Config{Server: ServerConfig{StartTimeout: -1}}, "StartTimeout"},
		{"too many subscriptions for the server", Config{Server: ServerConfig{MaxSubscriptions: math.MaxInt32 + 1}}, "MaxSubscriptions"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			require.ErrorIs(t, err, ErrBadConfig)
			assert.Contains(t, err.Error(), tc.setting)
			b, err := New(tc.cfg)
			assert.ErrorIs(t, err, ErrBadConfig, "New refuses it too")
			assert.Nil(t, b)
			if !reflect.DeepEqual(tc.cfg.Server, ServerConfig{}) {
				s, err := StartServer(tc.cfg.Server)
				if tc.setting != "Server.MaxMessageBytes" {
					assert.ErrorIs(t, err, ErrBadConfig, "and StartServer")
					assert.Nil(t, s)
				} else if assert.NoError(t, err) {
					s.Close()
				}
			}
		})
	}
	t.Run("a listen address off loopback", func(t *testing.T) {
		err := Config{Server: ServerConfig{Listen: "192.0.2.1:4222"}}.Validate()
		assert.ErrorIs(t, err, ErrNotLoopback)
		assert.NoError(t, Config{URL: "nats://127.0.0.1:4222", Server: ServerConfig{Listen: "192.0.2.1:4222"}}.Validate(),
			"the embedded server's settings do not matter with an external server")
	})
	for _, tc := range []struct {
		name    string
		cfg     ClientConfig
		setting string
	}{
		{"two credentials", ClientConfig{Token: "t", CredsFile: "x.creds"}, "one credential"},
		{"a token and a session credential", ClientConfig{Token: "t", User: "u", Password: "p", Session: "s"}, "one credential"},
		{"a password without its user", ClientConfig{Password: "p"}, "Password"},
		{"a session credential without its session", ClientConfig{User: "u", Password: "p"}, "Session"},
		{"a negative buffer", ClientConfig{Token: "t", Buffer: -1}, "Buffer"},
		{"a negative message limit", ClientConfig{Token: "t", MaxMessageBytes: -1}, "MaxMessageBytes"},
	} {
		t.Run("client: "+tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			require.ErrorIs(t, err, ErrBadConfig)
			assert.Contains(t, err.Error(), tc.setting)
			c, err := Dial(tc.cfg)
			assert.ErrorIs(t, err, ErrBadConfig, "Dial refuses it too")
			assert.Nil(t, c)
		})
	}
	t.Run("every setting out of range is named", func(t *testing.T) {
		err := Config{MaxInFlight: -1, CloseGrace: -1, Server: ServerConfig{SlowConsumerBytes: -1}}.Validate()
		for _, setting := range []string{"MaxInFlight", "CloseGrace", "SlowConsumerBytes"} {
			assert.Contains(t, err.Error(), setting)
		}
		assert.True(t, errors.Is(err, ErrBadConfig))
	})
}

// TestSessionRate: 0 is the default rate, NoSessionRate (or +Inf) no
// bound at all, anything else itself.
func TestSessionRate(t *testing.T) {
	assert.Equal(t, rate.Limit(DefaultSessionRate), sessionRate(Config{}.withDefaults().SessionRate))
	assert.Equal(t, rate.Inf, sessionRate(Config{SessionRate: NoSessionRate}.withDefaults().SessionRate))
	assert.Equal(t, rate.Inf, sessionRate(Config{SessionRate: math.Inf(1)}.withDefaults().SessionRate))
	assert.Equal(t, rate.Limit(50), sessionRate(Config{SessionRate: 50}.withDefaults().SessionRate))
}
