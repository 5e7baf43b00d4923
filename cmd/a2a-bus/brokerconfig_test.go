package main

import (
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/broker"
	"github.com/a2a-bus/a2a-bus/store"
)

// TestServeFlagsMapOntoTheBrokersConfig: a flag's 0 that turns a bound
// off becomes the Config's explicit value for off, and the defaults the
// broker's own.
func TestServeFlagsMapOntoTheBrokersConfig(t *testing.T) {
	for name, tc := range map[string]struct {
		args      []string
		orphan    time.Duration
		retention store.Retention
	}{
		"defaults": {nil, broker.DefaultOrphanTimeout, broker.DefaultRetention},
		"off":      {[]string{"--orphan-timeout=0", "--retention=0", "--retention-tasks=0"}, broker.Forever, store.Retention{}},
		"one off":  {[]string{"--retention=0"}, broker.DefaultOrphanTimeout, store.Retention{MaxTerminal: broker.DefaultRetention.MaxTerminal}},
	} {
		t.Run(name, func(t *testing.T) {
			var o serveOptions
			require.NoError(t, serveFlags(&o, io.Discard).Parse(tc.args))
			o.dataDir = ""
			cfg, _, err := o.brokerConfig(store.NewMemory(), nil)
			require.NoError(t, err)
			require.NoError(t, cfg.Validate())
			assert.Equal(t, tc.orphan, cfg.OrphanTimeout)
			require.NotNil(t, cfg.Retention)
			assert.Equal(t, tc.retention, *cfg.Retention)
		})
	}
}
