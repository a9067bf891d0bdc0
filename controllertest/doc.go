// Package controllertest helps test code that runs controllers of
// [github.com/bgctl/controller].
//
// Controllers are goroutines that wait on timers, which makes
// testing/synctest the tool for their tests: inside a bubble, time moves
// only when every goroutine is blocked, so a retry after 1s, 2s, 3s happens
// at exactly those times and the test takes no time at all. Three rules
// keep such tests exact:
//
//   - Make the Manager inside the bubble, or at least install the
//     controllers there, so their goroutines and timers belong to it.
//   - Call synctest.Wait before reading a status: it returns once every
//     controller has finished what it could do at this instant.
//   - Wait for a number of runs with [Runs], which blocks without polling
//     and never stalls the controller that reports to it; a HealthReporter
//     that sends on a channel nobody reads would.
//
// End each test by removing the controllers (RemoveAllAndWait or Shutdown)
// so that go.uber.org/goleak finds no goroutine left behind. For code that
// only reads statuses or Health, controller.FakeManager gives a Manager of
// failing controllers without goroutines.
package controllertest
