package liveview_test

import (
	"context"
	"fmt"
	"net"
	"net/http"

	"github.com/a2a-bus/a2a-bus/broker"
	"github.com/a2a-bus/a2a-bus/internal/secret"
	"github.com/a2a-bus/a2a-bus/liveview"
	"github.com/a2a-bus/a2a-bus/natsbus"
	"github.com/a2a-bus/a2a-bus/store"
)

// A broker on an embedded NATS server, and its live view on loopback, as
// a2a-bus serve --ui runs them. The address to open carries the token in
// its fragment, which the browser never sends.
func Example() {
	ctx := context.Background()
	bus, err := natsbus.New(natsbus.Config{})
	if err != nil {
		panic(err)
	}
	defer bus.Close()
	b, err := broker.New(ctx, bus, broker.Config{Store: store.NewMemory()})
	if err != nil {
		panic(err)
	}
	defer b.Close()
	client, err := bus.Connect(natsbus.ClientConfig{}) // the host credential, in process
	if err != nil {
		panic(err)
	}
	defer client.Close()
	token := secret.Hex(32)
	view, err := liveview.New(client, liveview.Config{Token: token})
	if err != nil {
		panic(err)
	}
	defer view.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	srv := &http.Server{Handler: view.Handler()}
	go srv.Serve(ln)
	defer srv.Close()
	fmt.Printf("open http://%s/#token=%s\n", ln.Addr(), token)
}
