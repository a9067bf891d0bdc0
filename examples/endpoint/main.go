// Command endpoint runs a network endpoint as an agent would: an owner type
// that embeds a controller.Manager and binds its controllers to its own
// lifetime. It prints the controllers' status every two seconds and, after
// -duration, shuts them down and exits.
//
//	go run ./examples/endpoint -duration 10s
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/bgctl/controller"
	"github.com/sirupsen/logrus"
)

// Endpoint is the owner of a few controllers. It embeds a Manager by value:
// the zero Manager is ready to use, and removing all its controllers is part
// of tearing the endpoint down.
type Endpoint struct {
	controller.Manager

	ID int

	mu       sync.Mutex
	revision int // bumped by every regeneration
	synced   int // the revision last written to the store
	attempts int // sync attempts so far
}

// NewEndpoint returns an endpoint with its controllers installed.
func NewEndpoint(id int) *Endpoint {
	ep := &Endpoint{ID: id}
	name := func(what string) string { return fmt.Sprintf("endpoint-%d-%s", id, what) }

	// Writes the endpoint to a store that refuses the first three writes:
	// retried after 200ms, 400ms, 600ms, then it succeeds.
	ep.UpdateController(name("sync-to-store"), controller.ControllerParams{
		Group:                  controller.NewGroup("endpoint-sync"),
		DoFunc:                 ep.syncToStore,
		ErrorRetryBaseDuration: 200 * time.Millisecond,
		MaxRetryInterval:       2 * time.Second,
	})
	// Regenerates the endpoint's datapath every second.
	ep.UpdateController(name("regenerate"), controller.ControllerParams{
		Group:       controller.NewGroup("endpoint-regenerate"),
		DoFunc:      ep.regenerate,
		RunInterval: time.Second,
	})
	// Annotates the endpoint once; the ExitReason says it is done.
	ep.UpdateController(name("annotate"), controller.ControllerParams{
		Group: controller.NewGroup("endpoint-annotate"),
		DoFunc: func(ctx context.Context) error {
			return controller.NewExitReason("annotation applied")
		},
	})
	return ep
}

var errStoreUnavailable = errors.New("store unavailable")

func (ep *Endpoint) syncToStore(ctx context.Context) error {
	ep.mu.Lock()
	defer ep.mu.Unlock()
	ep.attempts++
	if ep.attempts <= 3 {
		return errStoreUnavailable
	}
	ep.synced = ep.revision
	return nil
}

func (ep *Endpoint) regenerate(ctx context.Context) error {
	ep.mu.Lock()
	defer ep.mu.Unlock()
	ep.revision++
	return nil
}

// Delete tears the endpoint down: its controllers are removed and their
// StopFuncs have run when it returns, or ctx ended.
func (ep *Endpoint) Delete(ctx context.Context) error {
	return ep.Shutdown(ctx)
}

// run drives one endpoint for duration, printing its status every interval.
func run(ctx context.Context, out io.Writer, duration, interval time.Duration) error {
	ep := NewEndpoint(1)
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	deadline := time.NewTimer(duration)
	defer deadline.Stop()
	for done := false; !done; {
		select {
		case <-ticker.C:
		case <-deadline.C:
			done = true
		case <-ctx.Done():
			done = true
		}
		if err := controller.FormatStatus(out, ep.GetStatusModel(), true); err != nil {
			return err
		}
		fmt.Fprintln(out)
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return ep.Delete(shutdownCtx)
}

func main() {
	duration := flag.Duration("duration", 10*time.Second, "how long to run before shutting down")
	flag.Parse()
	logrus.SetLevel(logrus.InfoLevel)
	if err := run(context.Background(), os.Stdout, *duration, 2*time.Second); err != nil {
		fmt.Fprintln(os.Stderr, "endpoint:", err)
		os.Exit(1)
	}
}
