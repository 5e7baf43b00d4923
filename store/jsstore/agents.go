package jsstore

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/a2a-bus/a2a-bus/store"
)

// PutRegistration implements store.Registry.
func (s *Store) PutRegistration(ctx context.Context, reg store.Registration) error {
	if err := s.enter(); err != nil {
		return err
	}
	defer s.leave()
	data, err := json.Marshal(reg)
	if err != nil {
		return fmt.Errorf("jsstore: encode the registration of %s: %w", reg.Instance, err)
	}
	_, err = s.agents.write(ctx, put(regKey(reg.Instance), data, anyRev))
	return err
}

// DeleteRegistration implements store.Registry.
func (s *Store) DeleteRegistration(ctx context.Context, instance string) error {
	if err := s.enter(); err != nil {
		return err
	}
	defer s.leave()
	_, err := s.agents.write(ctx, remove(regKey(instance), anyRev))
	return err
}

// RegistrationRev returns the stored registration of instance and its
// revision, read from the stream leader, or store.ErrNotFound (with
// revision 0).
func (s *Store) RegistrationRev(ctx context.Context, instance string) (*store.Registration, uint64, error) {
	if err := s.enter(); err != nil {
		return nil, 0, err
	}
	defer s.leave()
	reg, rev, err := s.registrationAt(ctx, regKey(instance))
	if err == nil && reg == nil {
		err = store.ErrNotFound
	}
	return reg, rev, err
}

// PutRegistrationAt stores reg if the registration of its instance is
// still the one of revision rev (RegistrationRev), or, for rev 0, if
// there is none; else it returns store.ErrChanged and stores nothing.
func (s *Store) PutRegistrationAt(ctx context.Context, reg store.Registration, rev uint64) error {
	if err := s.enter(); err != nil {
		return err
	}
	defer s.leave()
	data, err := json.Marshal(reg)
	if err != nil {
		return fmt.Errorf("jsstore: encode the registration of %s: %w", reg.Instance, err)
	}
	return s.writeRegAt(ctx, put(regKey(reg.Instance), data, int64(rev)), rev, "put registration "+reg.Instance)
}

// DeleteRegistrationAt removes the registration of instance if it is
// still the one of revision rev (RegistrationRev); else it returns
// store.ErrChanged and removes nothing.
func (s *Store) DeleteRegistrationAt(ctx context.Context, instance string, rev uint64) error {
	if err := s.enter(); err != nil {
		return err
	}
	defer s.leave()
	return s.writeRegAt(ctx, remove(regKey(instance), int64(rev)), rev, "delete registration "+instance)
}

// writeRegAt makes o, a write of a registration's key that expects the
// revision rev (0: absent). A write that met another in flight is tried
// again; one that found another revision is store.ErrChanged, but for
// rev 0, where the key may hold a removal marker: absent still, so the
// write is tried again on the marker's revision.
func (s *Store) writeRegAt(ctx context.Context, o op, rev uint64, what string) error {
	for try := 0; ; try++ {
		_, err := s.agents.write(ctx, o)
		if !conflict(err) {
			return err
		}
		if wrongRev(err) {
			if rev != 0 {
				return fmt.Errorf("jsstore: %s: %w", what, store.ErrChanged)
			}
			e, err := s.agents.get(ctx, o.key)
			switch {
			case err != nil:
				return err
			case e.live():
				return fmt.Errorf("jsstore: %s: %w", what, store.ErrChanged)
			}
			o.expect = int64(e.absentRev())
		}
		if err := backoff(ctx, try, what); err != nil {
			return err
		}
	}
}

// wrongRev reports whether err is a compare-and-set that found another
// revision stored (not one that met another write in flight).
func wrongRev(err error) bool {
	var a *jetstream.APIError
	return errors.As(err, &a) && a.ErrorCode == codeWrongLastSeq
}

// Registrations implements store.Registry: the names of the
// registrations' keys, then each registration, read from the stream
// leader.
func (s *Store) Registrations(ctx context.Context) ([]store.Registration, error) {
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.leave()
	var keys []string
	if err := s.agents.keys(ctx, "r.*", func(key string) error {
		keys = append(keys, key)
		return nil
	}); err != nil {
		return nil, err
	}
	out := []store.Registration{}
	for start := 0; start < len(keys); start += listReaders {
		batch := keys[start:min(start+listReaders, len(keys))]
		regs := make([]*store.Registration, len(batch))
		errs := make([]error, len(batch))
		var wg sync.WaitGroup
		for i, key := range batch {
			wg.Go(func() { regs[i], errs[i] = s.registration(ctx, key) })
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			return nil, err
		}
		for _, r := range regs {
			if r != nil {
				out = append(out, *r)
			}
		}
	}
	slices.SortFunc(out, func(a, b store.Registration) int { return cmp.Compare(a.Instance, b.Instance) })
	return out, nil
}

// registration reads the registration under key: nil when it was
// removed.
func (s *Store) registration(ctx context.Context, key string) (*store.Registration, error) {
	reg, _, err := s.registrationAt(ctx, key)
	return reg, err
}

// registrationAt is registration with its revision (0 when removed).
func (s *Store) registrationAt(ctx context.Context, key string) (*store.Registration, uint64, error) {
	instance, err := lastToken(key)
	if err != nil {
		return nil, 0, err
	}
	e, err := s.agents.get(ctx, key)
	if err != nil || !e.live() {
		return nil, 0, err
	}
	var reg store.Registration
	if err := json.Unmarshal(e.data, &reg); err != nil || reg.Instance != instance {
		// Skipping it would let another agent take its name.
		return nil, 0, fmt.Errorf("%w: the registration of %q", ErrCorrupt, instance)
	}
	return &reg, e.rev, nil
}

// ClaimName implements store.Names: a write that requires the name's key
// absent, so that of concurrent claims exactly one is stored.
func (s *Store) ClaimName(ctx context.Context, agentID, instance string) error {
	if err := s.enter(); err != nil {
		return err
	}
	defer s.leave()
	key := nameKey(agentID)
	var rev uint64
	for try := 0; ; try++ {
		_, err := s.agents.write(ctx, put(key, []byte(instance), int64(rev)))
		if !conflict(err) {
			return err
		}
		e, err := s.agents.get(ctx, key)
		switch {
		case err != nil:
			return err
		case e.live() && string(e.data) == instance:
			return nil
		case e.live():
			return store.ErrNameTaken
		}
		rev = e.absentRev()
		if err := backoff(ctx, try, "claim name "+agentID); err != nil {
			return err
		}
	}
}

// ReleaseName implements store.Names: a removal that requires the name's
// key unchanged since it was read as instance's.
func (s *Store) ReleaseName(ctx context.Context, agentID, instance string) error {
	if err := s.enter(); err != nil {
		return err
	}
	defer s.leave()
	key := nameKey(agentID)
	for try := 0; ; try++ {
		e, err := s.agents.get(ctx, key)
		if err != nil {
			return err
		}
		if !e.live() || string(e.data) != instance {
			return nil
		}
		_, err = s.agents.write(ctx, remove(key, int64(e.rev)))
		if !conflict(err) {
			return err
		}
		if err := backoff(ctx, try, "release name "+agentID); err != nil {
			return err
		}
	}
}

// NameHolder implements store.Names.
func (s *Store) NameHolder(ctx context.Context, agentID string) (string, error) {
	if err := s.enter(); err != nil {
		return "", err
	}
	defer s.leave()
	e, err := s.agents.get(ctx, nameKey(agentID))
	if err != nil {
		return "", err
	}
	if !e.live() {
		return "", store.ErrNotFound
	}
	return string(e.data), nil
}
