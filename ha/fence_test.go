// Tests of the fence alone, in a synctest bubble; what its passing does
// to a replica's controllers is tested against etcd, in ha/etcd.

package ha

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"
)

func TestFenceMovesOnlyForward(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		f := newFence(start.Add(100 * time.Millisecond))
		defer f.stop(ErrClosed)
		if !f.extend(start.Add(300 * time.Millisecond)) {
			t.Fatal("extend of an open fence reported it passed")
		}
		f.extend(start.Add(200 * time.Millisecond)) // earlier: ignored
		time.Sleep(299 * time.Millisecond)
		synctest.Wait()
		if !f.open() || f.ctx.Err() != nil {
			t.Fatalf("fence passed before its deadline, at %v", time.Since(start))
		}
		if got := f.remaining(); got != time.Millisecond {
			t.Errorf("remaining = %v, want 1ms", got)
		}
		time.Sleep(time.Millisecond)
		synctest.Wait()
		if f.open() || !errors.Is(context.Cause(f.ctx), ErrFencePassed) {
			t.Fatalf("fence open at its deadline; cause %v", context.Cause(f.ctx))
		}
		if f.extend(time.Now().Add(time.Hour)) {
			t.Error("a passed fence was extended")
		}
		if f.open() || f.remaining() != 0 {
			t.Error("a passed fence reopened")
		}
	})
}

func TestFenceExpireHasACause(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFence(time.Now().Add(time.Hour))
		defer f.stop(ErrClosed)
		f.expire(errLeaseLost)
		if !errors.Is(context.Cause(f.ctx), errLeaseLost) || f.open() {
			t.Errorf("after expire: open %v, cause %v", f.open(), context.Cause(f.ctx))
		}
	})
}
