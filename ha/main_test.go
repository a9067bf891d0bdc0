package ha

import (
	"testing"

	"go.uber.org/goleak"
)

// Every replica of these tests joins its goroutines in Leave or Close.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
