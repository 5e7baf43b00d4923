package pipebus_test

import (
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/pipebus"
	"github.com/a2a-bus/a2a-bus/wire"
)

func TestConfigValidate(t *testing.T) {
	for _, c := range []struct {
		name string
		cfg  pipebus.Config
		want string // "" for a valid config
	}{
		{"the zero value", pipebus.Config{}, ""},
		{"every setting", pipebus.Config{MaxMessageBytes: 4096, Queue: 1, MaxInFlight: 1, WriteTimeout: time.Second, CloseGrace: time.Second}, ""},
		{"the largest message limit", pipebus.Config{MaxMessageBytes: wire.MaxMessageLimit}, ""},
		{"a negative message limit", pipebus.Config{MaxMessageBytes: -1}, "Config.MaxMessageBytes"},
		{"a message limit past the broker's", pipebus.Config{MaxMessageBytes: wire.MaxMessageLimit + 1}, "Config.MaxMessageBytes"},
		{"a negative queue", pipebus.Config{Queue: -1}, "Config.Queue"},
		{"negative requests in flight", pipebus.Config{MaxInFlight: -1}, "Config.MaxInFlight"},
		{"a negative write timeout", pipebus.Config{WriteTimeout: -time.Second}, "Config.WriteTimeout"},
		{"a negative close grace", pipebus.Config{CloseGrace: -1}, "Config.CloseGrace"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := c.cfg.Validate()
			if c.want == "" {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), c.want)
			_, _, err = pipebus.Pair(c.cfg, pipebus.ClientConfig{})
			assert.ErrorContains(t, err, c.want, "Pair refuses it")
		})
	}
}

func TestClientConfigValidate(t *testing.T) {
	for _, c := range []struct {
		name string
		cfg  pipebus.ClientConfig
		want string
	}{
		{"the zero value", pipebus.ClientConfig{}, ""},
		{"set", pipebus.ClientConfig{MaxMessageBytes: 4096, Buffer: 1}, ""},
		{"a negative message limit", pipebus.ClientConfig{MaxMessageBytes: -1}, "ClientConfig.MaxMessageBytes"},
		{"a negative buffer", pipebus.ClientConfig{Buffer: -1}, "ClientConfig.Buffer"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := c.cfg.Validate()
			if c.want == "" {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), c.want)
			_, _, err = pipebus.Pair(pipebus.Config{}, c.cfg)
			assert.ErrorContains(t, err, c.want, "Pair refuses it")
			r, w, err := os.Pipe()
			require.NoError(t, err)
			defer r.Close()
			defer w.Close()
			_, err = pipebus.NewClient(r, w, c.cfg)
			assert.ErrorContains(t, err, c.want, "NewClient refuses it")
			cmd := exec.Command("a2a-bus-never-started")
			_, err = pipebus.Start(cmd, c.cfg)
			assert.ErrorContains(t, err, c.want, "Start refuses it")
			assert.Nil(t, cmd.Process, "the child is not started")
		})
	}
}

// TestABusOfABadConfigIsAnError: New refuses a config Validate refuses,
// naming the setting.
func TestABusOfABadConfigIsAnError(t *testing.T) {
	r, w, err := os.Pipe()
	require.NoError(t, err)
	defer r.Close()
	defer w.Close()
	bus, err := pipebus.New(r, w, pipebus.Config{Queue: -1})
	assert.ErrorContains(t, err, "Config.Queue")
	assert.Nil(t, bus)
}
