package inbox_test

import "os"

// benchTarget is BENCH_TARGET: postgres (default), mysql or sqlite.
func benchTarget() string { return os.Getenv("BENCH_TARGET") }
