// Package version says which build of geolog this is: the release version
// (set at link time by make release: -X .../internal/version.Version=v1.2.3,
// "dev" otherwise) and the commit the Go toolchain records in a build made
// from a git checkout.
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
)

// Version is the release version, set by the linker; "dev" for builds that
// are not releases.
var Version = "dev"

// Commit is the git revision, set by the linker (make build) where the
// toolchain records none (-buildvcs=false); a "-modified" suffix says the
// work tree had changes.
var Commit = ""

// Info is what a build knows of itself.
type Info struct {
	Version string `json:"version"`
	// Commit is the git revision built, "" when the build recorded none
	// (go run, or a build outside a checkout); Modified says the work tree
	// had changes.
	Commit   string `json:"commit,omitempty"`
	Modified bool   `json:"modified,omitempty"`
	Go       string `json:"go"`
}

// Get returns this build's Info.
func Get() Info {
	info := Info{Version: Version, Go: runtime.Version()}
	if c, ok := strings.CutSuffix(Commit, "-modified"); ok {
		info.Commit, info.Modified = c, true
	} else {
		info.Commit = Commit
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				info.Commit = s.Value
			case "vcs.modified":
				info.Modified = s.Value == "true"
			}
		}
	}
	return info
}

// String is one line: "geolog dev (commit 1a2b3c4d5e6f, modified; go1.26)".
func (i Info) String() string {
	commit := "commit unknown"
	if i.Commit != "" {
		c := i.Commit
		if len(c) > 12 {
			c = c[:12]
		}
		commit = "commit " + c
		if i.Modified {
			commit += ", modified"
		}
	}
	return fmt.Sprintf("%s (%s; %s)", i.Version, commit, i.Go)
}
