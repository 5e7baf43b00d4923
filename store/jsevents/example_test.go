package jsevents_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/a2a-bus/a2a-bus/natsbus"
	"github.com/a2a-bus/a2a-bus/store/jsevents"
)

// A broker appends a session's notifications; the session's subscriber
// gets each one once it is stored, and a runtime that missed some replays
// them.
func ExampleLog() {
	dir, _ := os.MkdirTemp("", "jsevents-example-")
	defer os.RemoveAll(dir)
	s, _ := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, NoSigs: true, NoLog: true, JetStream: true, StoreDir: dir})
	s.Start()
	defer func() { s.Shutdown(); s.WaitForShutdown() }()
	s.ReadyForConnections(10 * time.Second)
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	log, err := jsevents.Open(ctx, nc, jsevents.Config{Window: 100})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer log.Close()

	live, _ := nc.SubscribeSync(natsbus.EventsSubject("chat-1"))
	for _, text := range []string{"hello", "world"} {
		seq, err := log.Append(ctx, "chat-1", func(seq uint64) ([]byte, error) {
			return json.Marshal(map[string]any{"jsonrpc": "2.0", "method": "a2a.push", "params": map[string]any{"seq": seq, "text": text}})
		})
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println("appended seq", seq)
	}
	m, _ := live.NextMsg(5 * time.Second)
	fmt.Printf("live: %s %s\n", m.Header.Get(jsevents.HeaderSeq), m.Data)

	events, oldest, last, _ := log.Since(ctx, "chat-1", 1, 1<<20)
	fmt.Printf("replay after 1: %s (oldest %d, last %d)\n", events, oldest, last)
	// Output:
	// appended seq 1
	// appended seq 2
	// live: 1 {"jsonrpc":"2.0","method":"a2a.push","params":{"seq":1,"text":"hello"}}
	// replay after 1: [{"jsonrpc":"2.0","method":"a2a.push","params":{"seq":2,"text":"world"}}] (oldest 1, last 2)
}
