package fakebus_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/a2a-bus/a2a-bus/broker/brokertest"
	"github.com/a2a-bus/a2a-bus/transport"
	"github.com/a2a-bus/a2a-bus/transport/bustest"
	"github.com/a2a-bus/a2a-bus/transport/fakebus"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestConformance(t *testing.T) {
	const buffer = 64
	f := bustest.Features{BoundSessions: true, HostScope: transport.ScopeHost, Buffer: buffer, MaxMessageBytes: 4096}
	newHarness := func(t *testing.T) bustest.Harness {
		b := fakebus.New(fakebus.Config{Buffer: buffer, MaxMessageBytes: 4096})
		return bustest.Harness{Bus: b, Client: b}
	}
	bustest.Run(t, f, newHarness)
	brokertest.Run(t, f, newHarness)
}

func TestConformanceOwner(t *testing.T) {
	f := bustest.Features{HostScope: transport.ScopeOwner}
	newHarness := func(t *testing.T) bustest.Harness {
		b := fakebus.New(fakebus.Config{Owner: true})
		return bustest.Harness{Bus: b, Client: b}
	}
	bustest.Run(t, f, newHarness)
	brokertest.Run(t, f, newHarness)
}

// BenchmarkRoundTrip compares a round trip without and with idempotency
// keys on the fake bus, where the broker's own work is most of the cost:
// go test -bench RoundTrip -count 10 ./transport/fakebus.
func BenchmarkRoundTrip(b *testing.B) {
	for _, keyed := range []bool{false, true} {
		b.Run(map[bool]string{false: "plain", true: "keyed"}[keyed], func(b *testing.B) {
			bus := fakebus.New(fakebus.Config{})
			defer bus.Close()
			h := bustest.Harness{Bus: bus, Client: bus}
			if keyed {
				brokertest.BenchmarkKeyedRoundTripOn(b, h, nil)
			} else {
				brokertest.BenchmarkRoundTripOn(b, h, nil)
			}
		})
	}
}
