package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/a2a-bus/a2a-bus/cluster"
)

var notBrokerNameRE = regexp.MustCompile(`[^A-Za-z0-9_-]`)

// defaultBrokerName is the host's name, as a broker name: the same
// across the broker's restarts on the host.
func defaultBrokerName() string {
	h, err := os.Hostname()
	if err != nil {
		return "broker"
	}
	h, _, _ = strings.Cut(h, ".")
	h = notBrokerNameRE.ReplaceAllString(h, "-")
	if len(h) > 64 {
		h = h[:64]
	}
	if h == "" {
		return "broker"
	}
	return h
}

// readSeed reads the auth callout issuer's seed from its file, which must
// be the user's own and not readable by others (it signs every session's
// admission).
func readSeed(path string) (string, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return "", fmt.Errorf("--nats-callout-seed: %w", err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return "", fmt.Errorf("--nats-callout-seed: %s is readable by others (mode %v): make it 0600", path, fi.Mode().Perm())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("--nats-callout-seed: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}

// clusterStartBound bounds how long serve waits for the cluster's
// JetStream (a meta leader, the streams made or found).
const clusterStartBound = 30 * time.Second

// openCluster connects to the --nats-url cluster for the broker's state
// and opens it, with issuer the callout issuer's public key ("" without
// --nats-callout-seed). The connection is the cluster's own, beside the bus's:
// it reconnects for as long as the broker runs, and closes with it.
func openCluster(ctx context.Context, o serveOptions, issuer string, log *slog.Logger) (*sharedState, error) {
	opts := []nats.Option{nats.Name("a2a-bus state " + o.brokerName), nats.MaxReconnects(-1),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Warn("nats: the state connection was cut; reconnecting", "error", err)
			}
		}),
		nats.ReconnectHandler(func(*nats.Conn) { log.Info("nats: the state connection is back") })}
	if o.natsCreds != "" {
		opts = append(opts, nats.UserCredentials(o.natsCreds))
	}
	nc, err := nats.Connect(o.natsURL, opts...)
	if err != nil {
		return nil, fmt.Errorf("--nats-url: connect for the cluster's state: %w", err)
	}
	octx, cancel := context.WithTimeout(ctx, clusterStartBound)
	defer cancel()
	c, err := cluster.Open(octx, nc, cluster.Config{Broker: o.brokerName, Replicas: o.replicas, Window: o.replayWindow, Issuer: issuer})
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("--state=jetstream: %w", err)
	}
	log.Info("broker state on the cluster's JetStream", "broker", o.brokerName, "replicas", o.replicas)
	return &sharedState{Cluster: c, nc: nc}, nil
}

// sharedState is the cluster's state and its connection.
type sharedState struct {
	*cluster.Cluster
	nc *nats.Conn
}

// Close closes the state, then its connection. Idempotent.
func (s *sharedState) Close() error {
	err := s.Cluster.Close()
	s.nc.Close()
	return err
}
