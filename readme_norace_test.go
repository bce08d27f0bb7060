//go:build !race

package outbox_test

// raceBuild is false in a test binary built without -race (see
// readme_race_test.go).
const raceBuild = false
