// A runnable example of the backoff policies, shown on pkg.go.dev.

package controller_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/bgctl/controller"
)

// A controller that backs off exponentially, from 1ms: its retries come
// 1ms, 2ms and 4ms after each failure. The status shows the policy,
// which is left out for the default, linear one.
func ExampleBackoff() {
	var mgr controller.Manager
	attempts := 0
	done := make(chan struct{})
	c := mgr.UpdateController("renew-cert", controller.ControllerParams{
		DoFunc: func(ctx context.Context) error {
			if attempts++; attempts < 4 {
				return errors.New("issuer unavailable")
			}
			close(done)
			return nil
		},
		Backoff:                controller.ExponentialBackoff,
		ErrorRetryBaseDuration: time.Millisecond,
		MaxRetryInterval:       time.Minute,
	})
	<-done
	_ = mgr.RemoveControllerAndWait("renew-cert")
	cfg, _ := json.Marshal(c.GetStatusModel().Configuration)
	fmt.Println(string(cfg))
	fmt.Println("attempts:", attempts)

	// A policy reads and writes as text, say from a flag.
	var b controller.Backoff
	fmt.Println("zero value:", b)
	err := b.UnmarshalText([]byte("constant"))
	fmt.Println("from text:", b, err)
	// Output:
	// {"error-retry":true,"backoff":"exponential","error-retry-base":"1ms","interval":"0s","max-retry-interval":"1m0s"}
	// attempts: 4
	// zero value: linear
	// from text: constant <nil>
}
