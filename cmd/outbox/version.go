package main

import (
	"runtime/debug"
	"strings"
)

// version describes this build for `outbox --version`: the module version
// ("(devel)" for a build from a checkout), then the VCS revision, commit
// time and whether the tree had local modifications, as the Go toolchain
// recorded them, and the Go version. Missing facts are left out.
func version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "(no build information)"
	}
	return describeBuild(bi)
}

func describeBuild(bi *debug.BuildInfo) string {
	v := bi.Main.Version
	if v == "" {
		v = "(devel)"
	}
	parts := []string{v}
	settings := map[string]string{}
	for _, s := range bi.Settings {
		settings[s.Key] = s.Value
	}
	if rev := settings["vcs.revision"]; rev != "" {
		parts = append(parts, "revision "+rev)
	}
	if t := settings["vcs.time"]; t != "" {
		parts = append(parts, "time "+t)
	}
	if m := settings["vcs.modified"]; m != "" {
		parts = append(parts, "modified "+m)
	}
	if bi.GoVersion != "" {
		parts = append(parts, bi.GoVersion)
	}
	return strings.Join(parts, ", ")
}
