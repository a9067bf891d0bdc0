// The example of serving the status over HTTP.

package controller_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/bgctl/controller"
)

// StatusHandler serves the controllers' status as text (for curl), JSON
// or an HTML page; HealthHandler serves 200 "ok" or 503 and the failing
// controllers.
func ExampleStatusHandler() {
	m := controller.FakeManager(2) // two controllers, each failing once
	mux := http.NewServeMux()
	mux.Handle("/controllers", controller.StatusHandler(m))
	mux.Handle("/healthz", controller.HealthHandler(m))

	for _, target := range []string{"/controllers?format=text", "/healthz"} {
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, target, nil))
		fmt.Printf("GET %s: %d\n%s", target, rec.Code, rec.Body)
	}
	// Output:
	// GET /controllers?format=text: 200
	// Controller Status: 0/2 healthy
	// Name           Last success   Last error   Count   Message
	// controller-0   never          0s ago       1       controller failed
	// controller-1   never          0s ago       1       controller failed
	// GET /healthz: 503
	// controller "controller-0": 1 consecutive failure: controller failed
	// controller "controller-1": 1 consecutive failure: controller failed
}
