// Controllers: the interface code that registers controllers is written
// against, satisfied by a Replica and, through Local, by a Manager.

package ha

import (
	"fmt"

	"github.com/bgctl/controller"
)

// Controllers is what code that registers controllers needs from the place
// they run. A [*Replica] satisfies it (each name runs on one replica of the
// group), and so does [Local] of a [controller.Manager] (every name runs in
// this process). Write the code that registers a service's controllers
// against Controllers, and the choice between one process and replicas is
// made once, where the service starts.
//
// UpdateController returns an error where [controller.Manager]'s returns
// the [*controller.Controller]: on a replica the controller is installed
// only while this replica holds the name's claim, so there is no
// controller to return.
type Controllers interface {
	// UpdateController registers a controller under name, or updates its
	// registration; the error names the refusal: an empty name, or a
	// Replica that left or a Manager that was shut down.
	UpdateController(name string, params controller.ControllerParams) error
	// TriggerController runs name's DoFunc at once if it runs in this
	// process, and reports whether it does.
	TriggerController(name string) bool
	// RemoveController unregisters name without waiting for it to stop;
	// the error wraps [controller.ErrControllerNotFound] for a name not
	// registered.
	RemoveController(name string) error
	// RemoveControllerAndWait unregisters name and waits until it no
	// longer runs in this process.
	RemoveControllerAndWait(name string) error
	// Running reports whether name's controller runs in this process now.
	// It takes one lock and looks one name up.
	Running(name string) bool
	// GetStatusModel returns the status of the controllers running in this
	// process, sorted by name.
	GetStatusModel() controller.ControllerStatuses
	// Manager returns the Manager the controllers of this process are
	// installed in, for what reads it: [controller.StatusHandler],
	// [controller.HealthHandler], [controller.Manager.Health] and
	// [controller.Manager.GetStoppingStatus]. Register and remove
	// controllers through the Controllers, never on this Manager directly
	// (see [Replica.Manager]).
	Manager() *controller.Manager
}

var (
	_ Controllers = (*Replica)(nil)
	_ Controllers = Local(nil)
)

// Local returns the Controllers of m: every registered name runs in this
// process, on m, as a single-process service runs them. A nil m is a new
// [controller.Manager] with no options.
//
// Use it where the service runs alone (a development setup, a test, a
// deployment of one) and [Join] where it runs as replicas, with the same
// registering code.
func Local(m *controller.Manager) Controllers {
	if m == nil {
		m = controller.NewManager()
	}
	return local{m}
}

// local adapts a Manager to Controllers.
type local struct{ m *controller.Manager }

// errEmptyName is the error of a registration without a name, from a
// Replica or Local.
func errEmptyName(method string) error {
	return fmt.Errorf("ha: %s: empty controller name", method)
}

func (l local) UpdateController(name string, params controller.ControllerParams) error {
	if name == "" {
		return errEmptyName("UpdateController")
	}
	if err := params.Validate(); err != nil {
		return fmt.Errorf("ha: UpdateController(%q): %w", name, err)
	}
	// The Manager returns nil for an empty name, ruled out above, and after
	// Shutdown.
	if l.m.UpdateController(name, params) == nil {
		return fmt.Errorf("ha: UpdateController(%q): %w", name, controller.ErrManagerShutDown)
	}
	return nil
}

func (l local) TriggerController(name string) bool { return l.m.TriggerController(name) }

func (l local) RemoveController(name string) error { return l.m.RemoveController(name) }

func (l local) RemoveControllerAndWait(name string) error {
	return l.m.RemoveControllerAndWait(name)
}

func (l local) Running(name string) bool { return l.m.Lookup(name) != nil }

func (l local) GetStatusModel() controller.ControllerStatuses { return l.m.GetStatusModel() }

func (l local) Manager() *controller.Manager { return l.m }

// errNotRegistered is the error of a removal of a name not registered, as
// the Manager words it.
func errNotRegistered(name string) error {
	return fmt.Errorf("ha: %w: %q", controller.ErrControllerNotFound, name)
}
