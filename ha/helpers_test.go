// Helpers of the package's in-package tests: a store nothing calls, and a
// logger that writes nothing.

package ha

import (
	"io"

	"github.com/sirupsen/logrus"
)

// idleStore is a Store for tests of a Replica that never joins: New asks
// it for a backend and reads the backend's limits, and nothing else.
type idleStore struct{}

// Backend returns an idleBackend.
func (idleStore) Backend(BackendConfig) (Backend, error) { return idleBackend{}, nil }

// idleBackend answers ClaimLimits; any other call panics on the nil
// Backend it embeds, which a test of a replica that never joins makes
// none of.
type idleBackend struct{ Backend }

// ClaimLimits answers etcd's defaults.
func (idleBackend) ClaimLimits() (names, bytes int) { return 128, 1 << 20 }

// discardLogger returns a logger that writes nothing.
func discardLogger() logrus.FieldLogger {
	l := logrus.New()
	l.SetOutput(io.Discard)
	return l
}
