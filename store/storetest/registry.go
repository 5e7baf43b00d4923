package storetest

import (
	"encoding/json"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/store"
)

// RunRegistry runs the registry part of the suite. newStore returns a
// new, empty store; the suite closes it.
func RunRegistry(t *testing.T, newStore func(t *testing.T) store.Store) {
	tests := []struct {
		name string
		fn   func(*testing.T, store.Store)
	}{
		{"ANewStoreHoldsNoRegistration", testRegistryEmpty},
		{"PutThenListReturnsItInInstanceOrder", testRegistryPut},
		{"PutReplacesTheInstancesRegistration", testRegistryReplace},
		{"DeleteRemovesItAndToleratesNone", testRegistryDelete},
		{"ReturnedRegistrationsAreCopies", testRegistryCopies},
		{"ConcurrentPutsAndDeletesAllLand", testRegistryConcurrent},
		{"RegistrationsAndTasksDoNotMeet", testRegistryApartFromTasks},
		{"AClosedStoreRefusesRegistrations", testRegistryClosed},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore(t)
			t.Cleanup(func() { s.Close() })
			tc.fn(t, s)
		})
	}
}

// NewRegistration returns a registration of instance in session, named
// id; the suite's fixture.
func NewRegistration(instance, session, id string) store.Registration {
	card, _ := json.Marshal(map[string]string{"name": "planner", "agentId": id, "contextId": session})
	return store.Registration{Instance: instance, Session: session, AgentID: id, Name: "planner", Card: card}
}

func registrations(t *testing.T, s store.Registry) []store.Registration {
	t.Helper()
	regs, err := s.Registrations(ctx())
	require.NoError(t, err)
	return regs
}

func testRegistryEmpty(t *testing.T, s store.Store) {
	assert.Empty(t, registrations(t, s))
}

func testRegistryPut(t *testing.T, s store.Store) {
	b := NewRegistration("inst-b", "chat-2", "planner-2")
	a := NewRegistration("inst-a", "chat-1", "planner")
	require.NoError(t, s.PutRegistration(ctx(), b))
	require.NoError(t, s.PutRegistration(ctx(), a))
	got := registrations(t, s)
	require.Len(t, got, 2)
	assert.Equal(t, a.Instance, got[0].Instance)
	assert.Equal(t, a.Session, got[0].Session)
	assert.Equal(t, a.AgentID, got[0].AgentID)
	assert.Equal(t, a.Name, got[0].Name)
	assert.JSONEq(t, string(a.Card), string(got[0].Card))
	assert.Equal(t, "planner-2", got[1].AgentID)
}

func testRegistryReplace(t *testing.T, s store.Store) {
	require.NoError(t, s.PutRegistration(ctx(), NewRegistration("inst-a", "chat-1", "planner")))
	renamed := NewRegistration("inst-a", "chat-1", "coder")
	renamed.Name = "coder"
	require.NoError(t, s.PutRegistration(ctx(), renamed))
	got := registrations(t, s)
	require.Len(t, got, 1)
	assert.Equal(t, "coder", got[0].AgentID)
	assert.Equal(t, "coder", got[0].Name)
}

func testRegistryDelete(t *testing.T, s store.Store) {
	require.NoError(t, s.PutRegistration(ctx(), NewRegistration("inst-a", "chat-1", "planner")))
	require.NoError(t, s.PutRegistration(ctx(), NewRegistration("inst-b", "chat-2", "planner-2")))
	require.NoError(t, s.DeleteRegistration(ctx(), "inst-a"))
	require.NoError(t, s.DeleteRegistration(ctx(), "inst-a"), "deleting what is not there is no error")
	require.NoError(t, s.DeleteRegistration(ctx(), "never-registered"))
	got := registrations(t, s)
	require.Len(t, got, 1)
	assert.Equal(t, "inst-b", got[0].Instance)
}

func testRegistryCopies(t *testing.T, s store.Store) {
	reg := NewRegistration("inst-a", "chat-1", "planner")
	require.NoError(t, s.PutRegistration(ctx(), reg))
	reg.Card[0] = 'X' // the caller's bytes are not the store's
	got := registrations(t, s)
	require.Len(t, got, 1)
	assert.True(t, json.Valid(got[0].Card), "the stored card is the one put, not the caller's later change")
	got[0].Card[0] = 'Y'
	again := registrations(t, s)
	assert.True(t, json.Valid(again[0].Card), "a returned card is a copy")
}

func testRegistryConcurrent(t *testing.T, s store.Store) {
	const n = 64
	var wg sync.WaitGroup
	errs := make(chan error, 2*n)
	for i := range n {
		wg.Go(func() {
			inst := fmt.Sprintf("inst-%03d", i)
			errs <- s.PutRegistration(ctx(), NewRegistration(inst, "chat", fmt.Sprintf("planner-%d", i+2)))
			if i%2 == 1 {
				errs <- s.DeleteRegistration(ctx(), inst)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	got := registrations(t, s)
	require.Len(t, got, n/2)
	for i, r := range got {
		assert.Equal(t, fmt.Sprintf("inst-%03d", 2*i), r.Instance)
	}
}

func testRegistryApartFromTasks(t *testing.T, s store.Store) {
	require.NoError(t, s.PutRegistration(ctx(), NewRegistration("a", "c1", "planner")))
	require.NoError(t, s.Create(ctx(), NewRecord("t1", "c1", "a", "b", 0), 0))
	recs, _, err := s.List(ctx(), store.Query{})
	require.NoError(t, err)
	assert.Equal(t, []string{"t1"}, idsOf(recs), "a registration is no task")
	n, err := s.OpenCount(ctx())
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	require.NoError(t, s.DeleteRegistration(ctx(), "a"))
	_, err = s.Get(ctx(), "t1")
	assert.NoError(t, err, "a deleted registration takes no task with it")
}

func testRegistryClosed(t *testing.T, s store.Store) {
	require.NoError(t, s.Close())
	assert.ErrorIs(t, s.PutRegistration(ctx(), NewRegistration("a", "c", "p")), store.ErrClosed)
	assert.ErrorIs(t, s.DeleteRegistration(ctx(), "a"), store.ErrClosed)
	_, err := s.Registrations(ctx())
	assert.ErrorIs(t, err, store.ErrClosed)
}

// RunDurableRegistry runs the durable part of the registry suite: the
// registrations survive a close and an open, as tasks do. open opens
// the store in dir, creating it when there is none.
func RunDurableRegistry(t *testing.T, open func(t *testing.T, dir string) store.Store) {
	t.Run("RegistrationsSurviveReopening", func(t *testing.T) {
		dir := t.TempDir()
		s := open(t, dir)
		require.NoError(t, s.PutRegistration(ctx(), NewRegistration("inst-a", "chat-1", "planner")))
		require.NoError(t, s.PutRegistration(ctx(), NewRegistration("inst-b", "chat-2", "planner-2")))
		require.NoError(t, s.PutRegistration(ctx(), NewRegistration("inst-c", "chat-3", "planner-3")))
		require.NoError(t, s.DeleteRegistration(ctx(), "inst-c"))
		require.NoError(t, s.Close())

		s = open(t, dir)
		defer s.Close()
		got := registrations(t, s)
		require.Len(t, got, 2)
		assert.Equal(t, NewRegistration("inst-a", "chat-1", "planner").AgentID, got[0].AgentID)
		assert.Equal(t, "chat-2", got[1].Session)
		assert.Equal(t, "planner-2", got[1].AgentID)
	})
}
