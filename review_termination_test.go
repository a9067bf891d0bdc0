// Review: the TerminationChannel index (stoppingByName, shadowed) loses a
// controller still stopping when a later one under the same name
// terminated before the next removal.

package controller

import (
	"context"
	"fmt"
	"testing"
	"testing/synctest"
)

// A removed under "x" keeps stopping; B is installed and removed under "x"
// and terminates at once; C is installed and removed and terminates. A is
// the one last removed under "x" that is still stopping, so, as its
// documentation says, TerminationChannel("x") must stay open until A
// returns. The index forgot A: when C was indexed, B (which shadowed A)
// had terminated, so C shadows nothing and the chain to A is cut; the
// channel returned is closed at once. Before the index (a scan of
// m.stopping) it found A.
//
// Other controllers stopping meanwhile (others) decide whether a prune,
// which rebuilds the index, comes between the removals; the test tries
// 0 to 8 of them.
func TestReviewTerminationChannelAfterThreeRemovals(t *testing.T) {
	for others := range 9 {
		t.Run(fmt.Sprintf("others=%d", others), func(t *testing.T) { terminationAfterThreeRemovals(t, others) })
	}
}

func terminationAfterThreeRemovals(t *testing.T, others int) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		release := make(chan struct{})
		for i := range others {
			name := fmt.Sprintf("other-%d", i)
			e.m.UpdateController(name, ControllerParams{DoFunc: NoopFunc, StopFunc: func(context.Context) error {
				<-release
				return nil
			}})
			synctest.Wait()
			if err := e.m.RemoveController(name); err != nil {
				t.Fatal(err)
			}
		}
		e.m.UpdateController("x", ControllerParams{DoFunc: NoopFunc, StopFunc: func(context.Context) error {
			<-release // A's StopFunc goes on
			return nil
		}})
		synctest.Wait()
		if err := e.m.RemoveController("x"); err != nil {
			t.Fatal(err)
		}
		for range 2 { // B, then C: each stops at once
			e.m.UpdateController("x", ControllerParams{DoFunc: NoopFunc})
			synctest.Wait()
			if err := e.m.RemoveController("x"); err != nil {
				t.Fatal(err)
			}
			synctest.Wait()
		}
		if n := len(e.m.GetStoppingStatus()); n != 1+others {
			t.Fatalf("%d controllers stopping, want %d", n, 1+others)
		}
		select {
		case <-e.m.TerminationChannel("x"):
			t.Errorf("TerminationChannel(\"x\") is closed while A, removed under x, is still stopping (its StopFunc has not returned)")
		default:
		}
		close(release)
		synctest.Wait()
	})
}
