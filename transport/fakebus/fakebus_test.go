package fakebus_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/a2a-bus/a2a-bus/transport"
	"github.com/a2a-bus/a2a-bus/transport/bustest"
	"github.com/a2a-bus/a2a-bus/transport/fakebus"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestConformance(t *testing.T) {
	const buffer = 64
	bustest.Run(t, bustest.Features{BoundSessions: true, HostScope: transport.ScopeHost, Buffer: buffer, MaxMessageBytes: 4096},
		func(t *testing.T) bustest.Harness {
			b := fakebus.New(fakebus.Config{Buffer: buffer, MaxMessageBytes: 4096})
			return bustest.Harness{Bus: b, Client: b}
		})
}

func TestConformanceOwner(t *testing.T) {
	bustest.Run(t, bustest.Features{HostScope: transport.ScopeOwner},
		func(t *testing.T) bustest.Harness {
			b := fakebus.New(fakebus.Config{Owner: true})
			return bustest.Harness{Bus: b, Client: b}
		})
}
