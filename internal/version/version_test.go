package version

import (
	"strings"
	"testing"
)

func TestString(t *testing.T) {
	for _, tc := range []struct {
		in   Info
		want string
	}{
		{Info{Version: "v1.2.3", Commit: "0123456789abcdef0123", Go: "go1.26"}, "v1.2.3 (commit 0123456789ab; go1.26)"},
		{Info{Version: "dev", Commit: "abc", Modified: true, Go: "go1.26"}, "dev (commit abc, modified; go1.26)"},
		{Info{Version: "dev", Go: "go1.26"}, "dev (commit unknown; go1.26)"},
	} {
		if got := tc.in.String(); got != tc.want {
			t.Errorf("%+v: %q, want %q", tc.in, got, tc.want)
		}
	}
	if g := Get(); g.Version != Version || !strings.HasPrefix(g.Go, "go") {
		t.Errorf("Get() = %+v", g)
	}
}
