// The example of logging beside a Manager, through its sink.

package controller_test

import (
	"log/slog"
	"os"

	"github.com/bgctl/controller"
)

// Code built around a Manager logs through Manager.Logger, to the sink
// the Manager's options chose, with the attributes of WithLogAttrs on its
// lines and on the controllers'.
func ExampleManager_Logger() {
	dropTime := func(_ []string, a slog.Attr) slog.Attr {
		if a.Key == slog.TimeKey {
			return slog.Attr{} // for a stable output
		}
		return a
	}
	sink := slog.New(slog.NewJSONHandler(os.Stdout, &slog.HandlerOptions{ReplaceAttr: dropTime}))
	m := controller.NewManager(controller.WithSlog(sink), controller.WithLogAttrs(slog.String("replica", "r0")))
	m.Logger().Info("joined", "members", 3)
	// Output:
	// {"level":"INFO","msg":"joined","subsys":"controller","replica":"r0","members":3}
}
