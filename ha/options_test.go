// Tests of Options: every bad field named, the defaults, and a
// registration that cannot run refused.

package ha

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/bgctl/controller"
)

func TestBadOptionsAreNamed(t *testing.T) {
	for _, tc := range []struct {
		opts Options
		want string // in the error
	}{
		{Options{}, "Prefix must not be empty"},
		{Options{Prefix: "/"}, "Prefix must not be empty"},
		{Options{Prefix: "p", TTL: 500 * time.Millisecond}, "TTL must be at least 1s, got 500ms"},
		{Options{Prefix: "p", TTL: 1500 * time.Millisecond}, "TTL must be whole seconds"},
		{Options{Prefix: "p", TTL: 2 * time.Second, Margin: 2 * time.Second}, "Margin must leave at least 200ms of TTL"},
		{Options{Prefix: "p", TTL: 2 * time.Second, Margin: time.Nanosecond}, "Margin must be at least 200ms"},
		{Options{Prefix: "p", Margin: -time.Second}, "Margin must be > 0"},
		{Options{Prefix: "/p/claims"}, `Prefix must not have a "members", "claims" or "name-sets" element`},
		{Options{Prefix: "/p/name-sets"}, `got "/p/name-sets"`},
		{Options{Prefix: "members/p"}, `got "members/p"`},
		{Options{Prefix: "p", ID: "a/b"}, `ID must not contain "/"`},
		{Options{Prefix: "p", ID: "web 1"}, `ID must not contain " "`},
		{Options{Prefix: "p", ID: "web\n1"}, `ID must not contain "\n"`},
		{Options{Prefix: "p", TTL: -time.Second}, "TTL must be at least 1s, got -1s"},
		{Options{Prefix: "p", Mode: 7}, "Mode must be Spread or Leader, got Mode(7)"},
		{Options{Prefix: "p", RequestTimeout: -1}, "RequestTimeout must not be negative"},
	} {
		_, err := tc.opts.normalize()
		if !errors.Is(err, ErrInvalidOptions) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: error %v, want one with %q wrapping ErrInvalidOptions", tc.opts, err, tc.want)
		}
	}
	if _, err := Join(context.Background(), nil, Options{Prefix: "p"}); !errors.Is(err, ErrInvalidOptions) || !strings.Contains(err.Error(), "store must not be nil") {
		t.Errorf("Join with a nil store: %v", err)
	}
}

// An invalid TTL is named alone: the Margin the user did not set is not
// reported against it.
func TestBadTTLIsNamedAlone(t *testing.T) {
	_, err := Options{Prefix: "p", TTL: -time.Second}.normalize()
	if err == nil || strings.Contains(err.Error(), "Margin") {
		t.Errorf("TTL -1s: error %v, want one about TTL alone", err)
	}
}

// A registration that cannot run is refused by UpdateController, on a
// Replica as through Local, and nothing is registered: the replica never
// claims it, and the mistake does not surface later, as an Error line on
// whichever replica holds the name.
func TestInvalidRegistrationIsRefused(t *testing.T) {
	r, err := New(idleStore{}, Options{Prefix: "/refuse", ID: "a", Logger: discardLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	do := func(context.Context) error { return nil }
	for _, tc := range []struct {
		params controller.ControllerParams
		want   string
	}{
		{controller.ControllerParams{}, "DoFunc must not be nil"},
		{controller.ControllerParams{DoFunc: do, RunInterval: -time.Second}, "RunInterval must not be negative"},
		{controller.ControllerParams{DoFunc: do, Backoff: controller.Backoff(99)}, "Backoff must be"},
	} {
		for what, c := range map[string]Controllers{"Replica": r, "Local": Local(controller.NewManager())} {
			err := c.UpdateController("job", tc.params)
			if !errors.Is(err, controller.ErrInvalidParams) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), `"job"`) {
				t.Errorf("%s: UpdateController(%+v) = %v, want an error naming job and %q, wrapping ErrInvalidParams", what, tc.params, err, tc.want)
			}
		}
		if names := r.Status().Names; len(names) != 0 {
			t.Errorf("after a refused registration the replica has names %v", names)
		}
	}
}

func TestDefaults(t *testing.T) {
	o, err := Options{Prefix: "svc/"}.normalize()
	if err != nil {
		t.Fatal(err)
	}
	if o.Prefix != "svc" || o.TTL != 10*time.Second || o.Margin != 2500*time.Millisecond ||
		o.RequestTimeout != 3750*time.Millisecond || o.ID == "" || o.keepAliveEvery() != 1875*time.Millisecond {
		t.Errorf("defaults: %+v", o)
	}
}
