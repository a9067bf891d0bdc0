// The faults the conformance suite injects into etcd's backend: a client
// whose next grant answers late, or whose next transaction commits and
// loses its answer, as a slow or broken network would.

package etcd

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// slowLease holds back the answer to the next Grant, once armed.
type slowLease struct {
	clientv3.Lease
	hold atomic.Int64 // the next Grant's hold, in nanoseconds; 0: none. Taken by that Grant.
}

func (l *slowLease) Grant(ctx context.Context, ttl int64) (*clientv3.LeaseGrantResponse, error) {
	resp, err := l.Lease.Grant(ctx, ttl)
	if d := time.Duration(l.hold.Swap(0)); d > 0 {
		time.Sleep(d) // the lease lives on the server meanwhile
	}
	return resp, err
}

// losingKV loses the answer to the next transaction, once armed: etcd
// commits it, and the caller gets an error.
type losingKV struct {
	clientv3.KV
	lose atomic.Bool // taken by the next Commit
}

func (k *losingKV) Txn(ctx context.Context) clientv3.Txn {
	return &losingTxn{Txn: k.KV.Txn(ctx), kv: k}
}

// losingTxn is one transaction of a losingKV. If, Then and Else return it
// rather than the transaction it wraps, so that Commit is its own.
type losingTxn struct {
	clientv3.Txn
	kv *losingKV
}

func (t *losingTxn) If(cs ...clientv3.Cmp) clientv3.Txn {
	t.Txn = t.Txn.If(cs...)
	return t
}

func (t *losingTxn) Then(ops ...clientv3.Op) clientv3.Txn {
	t.Txn = t.Txn.Then(ops...)
	return t
}

func (t *losingTxn) Else(ops ...clientv3.Op) clientv3.Txn {
	t.Txn = t.Txn.Else(ops...)
	return t
}

func (t *losingTxn) Commit() (*clientv3.TxnResponse, error) {
	resp, err := t.Txn.Commit()
	if err == nil && t.kv.lose.CompareAndSwap(true, false) {
		return nil, errors.New("ha: the answer to a transaction was lost (injected)")
	}
	return resp, err
}
