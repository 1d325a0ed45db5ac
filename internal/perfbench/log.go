package perfbench

import "log/slog"

// quiet keeps the hops' logs out of the table.
var quiet = slog.New(slog.DiscardHandler)
