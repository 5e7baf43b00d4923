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
