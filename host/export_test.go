package host

import (
	"context"
	"time"

	"github.com/a2a-bus/a2a-bus/transport/fakebus"
)

// OpenFake opens a host whose broker runs in this process on the in-memory
// fake bus (transport/fakebus): cfg.Bus and cfg.ConnectionFile are not
// used.
func OpenFake(ctx context.Context, cfg Config) (*Host, error) {
	if cfg.Broker.BusName == "" {
		cfg.Broker.BusName = "fake"
	}
	return open(ctx, cfg, fakebus.New(fakebus.Config{}))
}

// SetHealthEvery sets how often an idle host checks its broker, for a
// host in a test's child process: the process's every host, from now on.
func SetHealthEvery(d time.Duration) { healthEvery = d }
