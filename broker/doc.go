// Package broker is the host-wide A2A broker of ADR 0162: the registry of
// live agents with host-unique names, capability tokens, the routing of
// a2a.message.send, the durable task lifecycle with membership by instance
// id, and the per-session numbered notifications with replay.
//
// The broker is a transport.Handler written against the transport.Bus
// contract; it knows nothing of NATS or pipes. Its tasks live in a
// store.Store.
//
//	bus := fakebus.New(fakebus.Config{})
//	b, err := broker.New(context.Background(), bus, broker.Config{})
//	...
//	defer b.Close()
//	defer bus.Close()
package broker
