package runtime_test

import (
	"context"
	"fmt"

	"github.com/a2a-bus/a2a-bus/broker"
	"github.com/a2a-bus/a2a-bus/runtime"
	"github.com/a2a-bus/a2a-bus/transport/fakebus"
	"github.com/a2a-bus/a2a-bus/wire"
)

// Two chat sessions each spawn a delegate named discussant; the second
// is told it became discussant-2. The first hands it a task without
// naming it, and is woken by the answer.
func Example() {
	ctx := context.Background()
	bus := fakebus.New(fakebus.Config{}) // any bus: NATS, the pipe, ...
	b, _ := broker.New(context.Background(), bus, broker.Config{})
	defer b.Close()
	defer bus.Close()

	start := func(session string) *runtime.Runtime {
		sess, _ := bus.Session(ctx, session)
		rt, _ := runtime.New(ctx, sess, runtime.Config{})
		return rt
	}
	chat1, chat2 := start("chat-1"), start("chat-2")
	defer chat1.Close()
	defer chat2.Close()

	d1, _ := chat1.Spawn(ctx, wire.AgentCard{Name: "discussant"})
	d2, _ := chat2.Spawn(ctx, wire.AgentCard{Name: "discussant"})
	fmt.Println(d2.Prompt())

	task, _ := d1.Send(ctx, "", wire.Message{Parts: []wire.Part{wire.TextPart("seat 1 for me?")}}, nil)
	fmt.Println("task for", task.AgentName)

	ev, _ := d2.Wait(ctx)
	fmt.Println(d2.ID(), "got a task", ev.Task.Kind, "by", ev.Task.Message.From)
	d2.Update(ctx, ev.Task.TaskID, wire.StateCompleted, &wire.Message{Parts: []wire.Part{wire.TextPart("yes")}})

	ev, _ = d1.Wait(ctx)
	fmt.Println(d1.ID(), "woke:", ev.Task.Task.Status.State, *ev.Task.Message.Parts[0].Text)
	// Output:
	// Your A2A peer id is discussant-2 (discussant was taken on this host). Your session is chat-2.
	// task for discussant-2
	// discussant-2 got a task created by discussant
	// discussant woke: completed yes
}
