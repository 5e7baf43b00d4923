package host_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/host"
	"github.com/a2a-bus/a2a-bus/runtime"
)

func TestConfigValidate(t *testing.T) {
	for _, c := range []struct {
		name string
		cfg  host.Config
		want string // "" for a valid config
	}{
		{"NATS", host.Config{Bus: host.NATS}, ""},
		{"NATS, joining serve", host.Config{Bus: host.NATS, ConnectionFile: "c.json", HealthTimeout: time.Second}, ""},
		{"a pipe to a broker of the host's choice", host.Config{Bus: host.Pipe, BrokerCommand: []string{"broker"}, NoHealthCheck: true}, ""},
		{"in memory", host.Config{Bus: host.NATS, Memory: true}, ""},
		{"no bus", host.Config{}, "Config.Bus"},
		{"a bus that is not", host.Config{Bus: 9}, "Config.Bus"},
		{"a connection file on a pipe", host.Config{Bus: host.Pipe, ConnectionFile: "c.json"}, "ConnectionFile"},
		{"a broker command on NATS", host.Config{Bus: host.NATS, BrokerCommand: []string{"broker"}}, "BrokerCommand"},
		{"memory and a data dir", host.Config{Bus: host.NATS, Memory: true, DataDir: "d"}, "Memory and DataDir"},
		{"a negative health timeout is not off", host.Config{Bus: host.NATS, HealthTimeout: -1}, "HealthTimeout"},
		{"no check, and a timeout", host.Config{Bus: host.Pipe, NoHealthCheck: true, HealthTimeout: time.Second}, "choose one"},
		{"a bad runtime", host.Config{Bus: host.NATS, Runtime: runtime.Config{Queue: -1}}, "Config.Queue"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := c.cfg.Validate()
			if c.want == "" {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), c.want)
			// Open refuses it before it starts or joins a broker.
			_, err = host.Open(context.Background(), c.cfg)
			assert.ErrorContains(t, err, c.want)
		})
	}
}
