// What the tests of the stores' modules may read of a Replica: package
// probe's functions, set here.

package ha

import (
	"fmt"
	"time"

	"github.com/bgctl/controller"
	"github.com/bgctl/controller/ha/internal/probe"
)

func init() {
	locked := func(r any, f func(r *Replica)) {
		x := r.(*Replica)
		x.mu.Lock()
		defer x.mu.Unlock()
		f(x)
	}
	probe.Session = func(r any) (s int64) {
		locked(r, func(r *Replica) { s = int64(r.lease) })
		return s
	}
	probe.FenceDeadline = func(r any) (t time.Time) {
		locked(r, func(r *Replica) {
			if r.lease != 0 && r.fence != nil {
				t = r.fence.passedAt()
			}
		})
		return t
	}
	probe.Reading = func(r any, s int64) (lo time.Time, ok bool) {
		locked(r, func(r *Replica) {
			var a leaseAnswer
			a, ok = r.leaseLast[SessionID(s)]
			lo = a.lo
		})
		return lo, ok
	}
	probe.View = func(r any) (v string) {
		locked(r, func(r *Replica) { v = fmt.Sprintf("members %v, readings %v", r.memberLeases, r.leaseLast) })
		return v
	}
	probe.ClaimBatch = func(r any) int { return int(r.(*Replica).claimBatch.Load()) }
	probe.Stopped = func(r any) (b bool) {
		locked(r, func(r *Replica) { b = r.closed && len(r.stopReq) == 0 })
		return b
	}
	probe.Joined = func(r any) (b bool) {
		locked(r, func(r *Replica) { b = r.joined })
		return b
	}
	probe.Options = func(r any) any { return r.(*Replica).opts } // immutable after New
	probe.Window = func(o any) time.Duration { opts := o.(Options); return opts.window() }
	probe.RenewEvery = func(o any) time.Duration { opts := o.(Options); return opts.keepAliveEvery() }
	probe.Inner = func(r any) *controller.Manager { return r.(*Replica).inner }
	probe.Holding = func(r any, name string) (holder string, slot bool) {
		locked(r, func(r *Replica) {
			if c, ok := r.claims[name]; ok {
				holder = c.holder
			}
			slot = r.slots[name] != nil
		})
		return holder, slot
	}
	probe.Registered = func(r any, name string) (ok bool) {
		locked(r, func(r *Replica) { _, ok = r.regs[name] })
		return ok
	}
	probe.ReplaceLate = func(r any, name string, p controller.ControllerParams) (func(), error) {
		x := r.(*Replica)
		x.mu.Lock()
		s, term, err := x.unregisterLocked(name)
		if err == nil {
			err = x.updateControllerLocked(name, p)
		}
		x.mu.Unlock()
		if err != nil {
			return nil, err
		}
		return func() { x.awaitUnregistered(s, term) }, nil
	}
	probe.Confirmed = func(r any) (n int, all bool) {
		locked(r, func(r *Replica) { n, all = len(r.members), r.unconfirmedLocked() == nil })
		return n, all
	}
}
