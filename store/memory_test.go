package store_test

import (
	"testing"

	"github.com/a2a-bus/a2a-bus/store"
	"github.com/a2a-bus/a2a-bus/store/storetest"
)

func TestMemory(t *testing.T) {
	storetest.Run(t, func(*testing.T) store.Tasks { return store.NewMemory() })
	storetest.RunUpdate(t, func(*testing.T) store.Tasks { return store.NewMemory() })
}

func TestMemoryRegistrySuite(t *testing.T) {
	storetest.RunRegistry(t, func(*testing.T) store.Store { return store.NewMemory() })
}
