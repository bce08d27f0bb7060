package inbox_test

import "os"

// benchTarget is BENCH_TARGET: postgres (default), mysql,
// mysql-interpolate or sqlite.
func benchTarget() string { return os.Getenv("BENCH_TARGET") }
