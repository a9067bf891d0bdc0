// Tests of the backoff policies as values: their text, their validation,
// and what the status shows. Their waits are in schedule_test.go.

package controller

import (
	"encoding/json"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A policy writes as its name and reads back from it; a value that is no
// policy writes as Backoff(N), which reads back too, so that invalid
// parameters survive a round trip of the status; other text is refused
// with an error that quotes it.
func TestBackoffText(t *testing.T) {
	for _, tc := range []struct {
		b    Backoff
		text string
	}{
		{LinearBackoff, "linear"},
		{ExponentialBackoff, "exponential"},
		{ConstantBackoff, "constant"},
		{Backoff(3), "Backoff(3)"},
		{Backoff(255), "Backoff(255)"},
	} {
		assert.Equal(t, tc.text, tc.b.String())
		text, err := tc.b.MarshalText()
		require.NoError(t, err)
		assert.Equal(t, tc.text, string(text))
		var back Backoff
		require.NoError(t, back.UnmarshalText(text))
		assert.Equal(t, tc.b, back)
	}
	for _, bad := range []string{"", "Linear", "exp", "Backoff(256)", "Backoff(-1)", "Backoff(3", "backoff(3)"} {
		var b Backoff
		assert.EqualError(t, b.UnmarshalText([]byte(bad)), `controller.Backoff: want linear, exponential or constant, got "`+bad+`"`)
		assert.Equal(t, LinearBackoff, b, "unchanged by text it refuses")
	}
}

// A Backoff that is no policy makes the parameters invalid, named in the
// error; the controller parks and its status shows the value it was given.
func TestInvalidBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		p := ControllerParams{DoFunc: NoopFunc, Backoff: 7}
		assert.EqualError(t, p.Validate(), "invalid controller parameters: Backoff must be LinearBackoff, ExponentialBackoff or ConstantBackoff, got Backoff(7)")
		c := e.m.UpdateController("c", p)
		synctest.Wait()
		assert.Equal(t, 0, c.GetSuccessCount(), "parked")
		b, err := json.Marshal(c.GetStatusModel().Configuration)
		require.NoError(t, err)
		assert.JSONEq(t, `{"error-retry":true,"error-retry-base":"1s","interval":"0s","backoff":"Backoff(7)"}`, string(b))
		e.m.RemoveAllAndWait()
	})
}

// The status JSON shows the policy only when it is not linear: the
// default JSON stays Cilium's.
func TestStatusShowsBackoffOnlyWhenNotLinear(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		for b, want := range map[Backoff]string{
			LinearBackoff:      `{"error-retry":true,"error-retry-base":"1s","interval":"0s"}`,
			ExponentialBackoff: `{"error-retry":true,"error-retry-base":"1s","interval":"0s","backoff":"exponential"}`,
			ConstantBackoff:    `{"error-retry":true,"error-retry-base":"1s","interval":"0s","backoff":"constant"}`,
		} {
			c := e.m.UpdateController("c", ControllerParams{DoFunc: NoopFunc, Backoff: b})
			got, err := json.Marshal(c.GetStatusModel().Configuration)
			require.NoError(t, err)
			assert.JSONEq(t, want, string(got), "%v", b)
		}
		e.m.RemoveAllAndWait()
	})
}
