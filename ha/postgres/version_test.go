// The server version check, on values: no older server can run here.

package postgres

import (
	"errors"
	"strings"
	"testing"
)

// A server older than PostgreSQL 10 is refused with an error that names
// its version and wraps ErrServerTooOld; 10 and later pass.
func TestServerVersionCheck(t *testing.T) {
	for _, c := range []struct {
		num     int
		version string
		refused bool
	}{
		{90624, "9.6.24", true},
		{90500, "9.5.0", true},
		{99999, "9.6.99", true},
		{100000, "10.0", false},
		{100023, "10.23", false},
		{140015, "14.15", false},
		{150018, "15.18 (Debian 15.18-0+deb12u1)", false},
		{180001, "18.1", false},
	} {
		err := checkServerVersion(c.num, c.version)
		if !c.refused {
			if err != nil {
				t.Errorf("server %d (%s) refused: %v", c.num, c.version, err)
			}
			continue
		}
		if !errors.Is(err, ErrServerTooOld) {
			t.Errorf("server %d (%s): error %v, want one wrapping ErrServerTooOld", c.num, c.version, err)
			continue
		}
		if msg := err.Error(); !strings.Contains(msg, "PostgreSQL "+c.version+" ") || !strings.Contains(msg, "needs 10 or later") {
			t.Errorf("server %d: the error %q does not name the server's version and the one needed", c.num, msg)
		}
	}
}
