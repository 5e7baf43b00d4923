// Package e2e holds the tests that span the broker, both buses and the
// runtime: hostile input, load, and faults. It has no code of its own.
package e2e_test

import (
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/a2a-bus/a2a-bus/internal/testbin"
)

func TestMain(m *testing.M) {
	if spec := os.Getenv("E2E_FLOOD"); spec != "" {
		flood(spec) // a child of TestIsolation_AFloodQueuesBehindItself
	}
	goleak.VerifyTestMain(stopBrowserAfter{m}, goleak.Cleanup(testbin.Exit))
}

// stopBrowserAfter runs the tests, then stops the Chromium the browser
// tests share, before the leak check.
type stopBrowserAfter struct{ m *testing.M }

func (s stopBrowserAfter) Run() int {
	defer stopBrowser()
	return s.m.Run()
}
