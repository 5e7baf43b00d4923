package main

import (
	"fmt"
	"testing"

	"github.com/a2a-bus/a2a-bus/natsbus"
	"github.com/a2a-bus/a2a-bus/pipebus"
	"github.com/a2a-bus/a2a-bus/transport/bustest"
	"github.com/a2a-bus/a2a-bus/transport/fakebus"
)

// A bus under benchmark: how to make a fresh harness, and how to undo it.
type busKind struct {
	name string
	make func() (bustest.Harness, func(), error)
}

var buses = []busKind{
	{"fake", func() (bustest.Harness, func(), error) {
		b := fakebus.New(fakebus.Config{})
		return bustest.Harness{Bus: b, Client: b}, func() { b.Close() }, nil
	}},
	{"pipe", func() (bustest.Harness, func(), error) {
		bus, c, err := pipebus.Pair(pipebus.Config{}, pipebus.ClientConfig{})
		if err != nil {
			return bustest.Harness{}, nil, err
		}
		return bustest.Harness{Bus: bus, Client: c}, func() { c.Close(); bus.Close() }, nil
	}},
	{"nats-inproc", func() (bustest.Harness, func(), error) {
		bus, err := natsbus.New(natsbus.Config{})
		if err != nil {
			return bustest.Harness{}, nil, err
		}
		c, err := bus.Connect(natsbus.ClientConfig{})
		if err != nil {
			bus.Close()
			return bustest.Harness{}, nil, err
		}
		return bustest.Harness{Bus: bus, Client: c}, func() { c.Close(); bus.Close() }, nil
	}},
	{"nats-tcp", func() (bustest.Harness, func(), error) {
		bus, err := natsbus.New(natsbus.Config{})
		if err != nil {
			return bustest.Harness{}, nil, err
		}
		c, err := natsbus.Dial(natsbus.ClientConfig{URL: bus.URL(), Token: bus.Server().Token()})
		if err != nil {
			bus.Close()
			return bustest.Harness{}, nil, err
		}
		return bustest.Harness{Bus: bus, Client: c}, func() { c.Close(); bus.Close() }, nil
	}},
}

// onBus runs a benchmark function on a fresh harness of a bus.
func onBus(k busKind, fn func(b *testing.B, h bustest.Harness)) func(b *testing.B) {
	return func(b *testing.B) {
		h, undo, err := k.make()
		if err != nil {
			b.Fatal(fmt.Errorf("%s: %w", k.name, err))
		}
		defer undo()
		fn(b, h)
	}
}
