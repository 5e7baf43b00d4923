package host_test

import (
	"context"
	"fmt"

	"github.com/a2a-bus/a2a-bus/host"
	"github.com/a2a-bus/a2a-bus/wire"
)

// A host picks its bus by config and gets one runtime per chat session.
// host.NATS runs the broker in this process on an embedded NATS server;
// with ConnectionFile it joins a running `a2a-bus serve` instead.
func ExampleOpen() {
	ctx := context.Background()
	kind, _ := host.ParseBus("nats") // from the host's config
	// Memory: a throwaway host. Leave it out and the broker keeps its tasks
	// and names in the platform's state folder, across restarts.
	h, err := host.Open(ctx, host.Config{Bus: kind, Memory: true})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer h.Close()

	chat, err := h.Session(ctx, "chat-1")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer chat.Close()
	d, _ := chat.Spawn(ctx, wire.AgentCard{Name: "researcher"})
	fmt.Println(d.ID(), "in", d.SessionID())
	// Output:
	// researcher in chat-1
}
