package main

import (
	"fmt"
	"runtime/debug"
	"strings"
)

// buildVersion is what the Go toolchain recorded about this binary
// (runtime/debug.ReadBuildInfo): the module version, and the VCS revision
// when it was built from a checkout with VCS stamping on (go build's
// default; -buildvcs=false or a build outside a checkout leaves it out).
type buildVersion struct {
	Version   string // module version: a tag, a pseudo-version, or "(devel)"
	Revision  string // VCS commit, "" when not stamped
	Time      string // commit time (RFC 3339), "" when not stamped
	Dirty     bool   // the checkout had uncommitted changes
	GoVersion string // the toolchain that built it
}

// readBuildVersion reads the running binary's build info.
func readBuildVersion() buildVersion {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return buildVersion{Version: "unknown"}
	}
	v := buildVersion{Version: bi.Main.Version, GoVersion: bi.GoVersion}
	if v.Version == "" {
		v.Version = "(devel)"
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			v.Revision = s.Value
		case "vcs.time":
			v.Time = s.Value
		case "vcs.modified":
			v.Dirty = s.Value == "true"
		}
	}
	return v
}

// String is the line "dlock --version" prints, e.g.
//
//	dlock v1.4.0 (revision 3f9a1c07d2e4, 2026-11-02T10:00:00Z, go1.26.0)
//	dlock (devel) (revision 3f9a1c07d2e4, modified, 2026-11-02T10:00:00Z, go1.26.0)
//	dlock (devel) (no VCS information, go1.26.0)
func (v buildVersion) String() string {
	var parts []string
	if v.Revision != "" {
		parts = append(parts, "revision "+shorten(v.Revision, 12))
		if v.Dirty {
			parts = append(parts, "modified")
		}
		if v.Time != "" {
			parts = append(parts, v.Time)
		}
	} else {
		parts = append(parts, "no VCS information")
	}
	if v.GoVersion != "" {
		parts = append(parts, v.GoVersion)
	}
	return fmt.Sprintf("dlock %s (%s)", v.Version, strings.Join(parts, ", "))
}
