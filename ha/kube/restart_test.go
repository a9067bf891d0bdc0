// A replica process restarted under its own ID, as the kubelet restarts a
// crashed container in its pod: the new run waits in Join for the
// earlier run's session to be proven ended, whether that run was killed
// or is frozen, and starts none of its names before.

package kube

import (
	"slices"
	"syscall"
	"testing"
	"time"
)

// restartJoinBound is how long after the earlier run stopped a restarted
// run of its ID may take to join: D, the observers' proof (a read, a
// delete), Join's poll of 500ms, and room for a loaded machine.
const restartJoinBound = replicaTTL + 5*time.Second

// A replica process SIGKILLed while it runs names and started again at
// once under its ID joins once its earlier run's session is proven ended
// (by its own reading of the member Lease unchanged for D, or by the
// others' observers), within D and a few seconds of the kill, not with
// ErrDuplicateID; it gets its share back, and no name runs twice at once
// across the processes.
func TestReplicaProcessRestartedUnderItsIDJoins(t *testing.T) {
	t.Parallel() // each in a group of its own; their waits overlap
	p, names, held := startThreeProcesses(t)

	p.kill("c")
	killed := time.Now()
	p.startAs("c2", "c", false, false) // the restart: the same ID, at once
	p.expect("c2 joined", restartJoinBound+5*time.Second)
	joined := time.Since(killed)
	t.Logf("c restarted under its ID joined %v after SIGKILL (D = %v)", joined.Round(time.Millisecond), replicaTTL)
	if joined > restartJoinBound {
		t.Errorf("c restarted under its ID joined %v after SIGKILL; want within %v", joined, restartJoinBound)
	}
	// Spread places by ID: the restarted c gets exactly its earlier
	// share back, and a and b keep theirs.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		where, all := p.runs.placement(names)
		back := all
		for _, n := range names {
			back = back && (where[n] == "c2") == slices.Contains(held, n) && where[n] != "c"
		}
		if back {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("30s after the restart names run %v; want c's earlier share %v on the restarted c2, the rest on a and b", where, held)
		}
	}
}

// A replica process SIGSTOPped while it holds a name, and started again
// under its ID while the earlier run is frozen: the new run joins only
// once the frozen run's session is proven ended, D after it stopped at
// the earliest, and takes the name with a larger token; resumed, the
// frozen run's DoFunc, which never looks at its context, goes on writing,
// and the fenced write refuses it.
func TestReplicaProcessRestartedWhileItsEarlierRunIsFrozen(t *testing.T) {
	t.Parallel() // each in a group of its own; their waits overlap
	p, aToken := startFencedHolder(t)

	p.signal("a", syscall.SIGSTOP)
	stopped := time.Now()
	p.startAs("a2", "a", true, true) // the restart, while the earlier run is frozen
	p.expect("a2 joined", restartJoinBound+5*time.Second)
	joined := time.Since(stopped)
	bToken := p.claimOf("a2", 20*time.Second)
	took := time.Since(stopped)
	p.expect("a2 write ok", 10*time.Second)
	t.Logf("a restarted while frozen: joined %v and took job %v after SIGSTOP (D = %v); tokens %d, then %d",
		joined.Round(time.Millisecond), took.Round(time.Millisecond), replicaTTL, aToken, bToken)
	if joined < replicaTTL-time.Second {
		t.Errorf("the restarted a joined %v after the earlier run froze, before its session of %v could have ended", joined, replicaTTL)
	}
	if joined > restartJoinBound {
		t.Errorf("the restarted a joined %v after the earlier run froze; want within %v", joined, restartJoinBound)
	}
	p.resumeRefused("a2", aToken, bToken)
}
