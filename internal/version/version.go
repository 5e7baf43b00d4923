// Package version says which a2a-bus this is.
package version

import (
	"runtime"
	"runtime/debug"
)

// String returns the module version of the build ("(devel)" for a build
// from a checkout), with its VCS revision when the build recorded one.
func String() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	v := info.Main.Version
	if v == "" {
		v = "(devel)"
	}
	for _, s := range info.Settings {
		if s.Key == "vcs.revision" && len(s.Value) >= 12 {
			v += " " + s.Value[:12]
		}
	}
	return v
}

// Go returns the Go version the build used.
func Go() string { return runtime.Version() }
