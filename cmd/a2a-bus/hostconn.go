package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"

	"github.com/a2a-bus/a2a-bus/internal/connfile"
	"github.com/a2a-bus/a2a-bus/natsbus"
	"github.com/a2a-bus/a2a-bus/wire"
)

// hostFlags find a running broker for the operator's commands: through
// its connection file, or a NATS URL and a credential.
type hostFlags struct {
	connectionFile string
	natsURL        string
	token          string
	natsCreds      string
	// fs is the command's flag set: its output is the command's stderr,
	// where warnings go, and its name the command's.
	fs *flag.FlagSet
}

func (h *hostFlags) register(fs *flag.FlagSet) {
	h.fs = fs
	fs.StringVar(&h.connectionFile, "connection-file", "", "the broker's connection file (default $XDG_RUNTIME_DIR/a2a-bus/connection.json)")
	fs.StringVar(&h.natsURL, "nats-url", "", "the NATS URL of a broker serving with --nats-url (with --token or --nats-creds)")
	fs.StringVar(&h.token, "token", "", "the host credential for --nats-url")
	fs.StringVar(&h.natsCreds, "nats-creds", "", "a NATS credentials file for --nats-url")
}

// brokerRef is what is known of the broker a command talks to.
type brokerRef struct {
	url, file string
	pid       int
	ui        string // the live view's address (serve --ui), or ""
}

// dial connects as the host.
func (h *hostFlags) dial() (*natsbus.Client, brokerRef, error) {
	cfg := natsbus.ClientConfig{NoReconnect: true}
	var ref brokerRef
	if h.natsURL == "" && (h.token != "" || h.natsCreds != "") {
		return nil, ref, usageErrorf("--token and --nats-creds go with --nats-url")
	}
	if h.natsURL != "" {
		cfg.URL, cfg.Token, cfg.CredsFile = h.natsURL, h.token, h.natsCreds
		ref.url = h.natsURL
	} else {
		path := h.connectionFile
		if path == "" {
			p, warning, err := connfile.DefaultPath()
			if warning != "" {
				fmt.Fprintf(h.fs.Output(), "a2a-bus %s: warning: %s\n", h.fs.Name(), warning)
			}
			if err != nil {
				return nil, ref, err
			}
			path = p
		}
		info, err := connfile.Read(path)
		if err != nil {
			return nil, ref, fmt.Errorf("no running broker found: %v (a broker on a pipe belongs to its host and cannot be reached)", err)
		}
		if info.Token == "" {
			return nil, ref, fmt.Errorf("%s names a broker on an external NATS server: use --nats-url with --token or --nats-creds", path)
		}
		cfg.URL, cfg.Token = info.URL, info.Token
		ref = brokerRef{url: info.URL, file: path, pid: info.PID, ui: info.UIURL}
	}
	c, err := natsbus.Dial(cfg)
	if err != nil {
		return nil, ref, err
	}
	return c, ref, nil
}

// hostList reads every page of an admin list: page decodes one page,
// keeps its items and returns its nextPageToken.
func hostList(ctx context.Context, c *natsbus.Client, method string, page func(raw json.RawMessage) (string, error)) error {
	p := wire.PageParams{PageSize: wire.MaxPageSize}
	for {
		raw, err := c.CallHost(ctx, method, p)
		if err != nil {
			return fmt.Errorf("%s: %w", method, err)
		}
		next, err := page(raw)
		if err != nil || next == "" {
			return err
		}
		p.PageToken = next
	}
}

// hostCall makes a host call and decodes its result.
func hostCall(ctx context.Context, c *natsbus.Client, method string, out any) error {
	raw, err := c.CallHost(ctx, method, nil)
	if err != nil {
		return fmt.Errorf("%s: %w", method, err)
	}
	return json.Unmarshal(raw, out)
}
