// Package brokerid names the identities a broker keeps for its own
// agents (the A2A gateway's), so that every broker on a data dir, serve's
// or one a host starts, owns the same ones (docs/PROTOCOL.md §12).
package brokerid

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/a2a-bus/a2a-bus/broker"
	"github.com/a2a-bus/a2a-bus/internal/secret"
	"github.com/a2a-bus/a2a-bus/wire"
)

// GatewaySession is the A2A gateway's session: hidden from delegates, and
// the broker's own.
const GatewaySession = "a2a-gateway"

// LegacyGatewayInstance is the fixed instance id of the gateway's agent in
// versions before the kept one: owned all the same, so that no session
// can read what such a gateway left in a data dir.
const LegacyGatewayInstance = "a2a-gateway"

// Own makes cfg's broker own the gateway's identities on dataDir: its
// session is hidden, and its instance ids (the one kept in dataDir, and
// the legacy one) owned. It returns the kept instance id.
func Own(cfg *broker.Config, dataDir string) (string, error) {
	instance, err := KeptInstance(dataDir)
	if err != nil {
		return "", err
	}
	cfg.HiddenSessions = append(cfg.HiddenSessions, GatewaySession)
	cfg.OwnedInstances = append(cfg.OwnedInstances, instance, LegacyGatewayInstance)
	return instance, nil
}

// InstanceFile is the file in a broker's data dir that keeps the instance
// id of the gateway's agent.
const InstanceFile = "gateway-instance"

// KeptInstance returns the instance id of the gateway's agent for the
// broker whose data dir is dataDir, making it the first time: a random
// id, so that no session can guess it, kept so that the gateway of every
// later run of that broker is the same agent and gets its tasks back.
// dataDir "" (a broker that keeps nothing) gives a new id each call.
// The caller holds the data dir (its store is open).
func KeptInstance(dataDir string) (string, error) {
	fresh := "a2a-gateway-" + secret.Hex(16)
	if dataDir == "" {
		return fresh, nil
	}
	path := filepath.Join(dataDir, InstanceFile)
	data, err := os.ReadFile(path)
	switch {
	case err == nil:
		id := strings.TrimSpace(string(data))
		if wire.ValidateID("instanceId", id) != nil || !strings.HasPrefix(id, "a2a-gateway-") {
			return "", fmt.Errorf("%s does not hold an instance id; remove it to make a new one (the gateway's open tasks are then closed after the orphan timeout)", path)
		}
		return id, nil
	case !errors.Is(err, os.ErrNotExist):
		return "", fmt.Errorf("the gateway's instance id: %w", err)
	}
	// Written whole under another name and renamed into place, then the
	// folder synced: a crash leaves the old state or the new, never half.
	tmp := path + ".new"
	if err := writeSynced(tmp, []byte(fresh+"\n")); err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("the gateway's instance id: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("the gateway's instance id: %w", err)
	}
	if err := syncDir(dataDir); err != nil {
		return "", fmt.Errorf("the gateway's instance id: %w", err)
	}
	return fresh, nil
}

func writeSynced(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if serr := f.Sync(); err == nil {
		err = serr
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// syncDir makes a folder's new entry durable; Windows cannot sync a
// folder, and has no need to.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil && runtime.GOOS != "windows" {
		return err
	}
	return nil
}
