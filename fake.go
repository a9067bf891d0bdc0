// fake.go: FakeManager, for tests of code that only reads statuses.

package controller

import (
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
)

// FakeManager returns a Manager holding failingControllers controllers,
// named "controller-0", "controller-1", …, that each show one failure
// ("controller failed"), for tests of code that reads statuses or Health.
// Its controllers run nothing; removing one closes its termination channel.
// A FakeManager records no metrics and is left out of [GetGlobalStatus].
// Controllers installed in it later run as in any Manager.
func FakeManager(failingControllers int) *Manager {
	m := &Manager{fake: true, metricsSet: true}
	m.controllers = make(map[string]*Controller, failingControllers)
	now := time.Now().UnixNano()
	for i := range failingControllers {
		name := fmt.Sprintf("controller-%d", i)
		c := &Controller{name: name, mgr: m, fake: true, signal: make(chan struct{}, 1)}
		c.uuid = uuid.MustParse(fmt.Sprintf("00000000-0000-4000-8000-%012d", i))
		c.params.DoFunc = NoopFunc
		// Without c.mu: no other goroutine can see c yet.
		c.recordFailureLocked(errors.New("controller failed"), "controller failed", now)
		m.controllers[name] = c
	}
	return m
}
