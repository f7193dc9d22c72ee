package membership

import (
	"fmt"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
)

// TestDataDriven runs the scripts in testdata/ (regenerate with
// -rewrite). Commands, one node a line where a command takes nodes:
//
//	seed               id addr [zone]   the founding nodes
//	join               id addr [zone]   Join, one a line
//	state id=N to=S                     SetState
//	list                                every node, by id
//	replay                              seeds a new list with Founding() and
//	                                    applies every join and state of the
//	                                    script so far (what a node does when
//	                                    its catalogue replays), and says
//	                                    whether it ends equal
func TestDataDriven(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		l := &List{}
		var history []func(*List) (bool, error)
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			switch d.Cmd {
			case "seed":
				return result(false, l.Seed(ddNodes(t, d)))
			case "join":
				var out []string
				for _, n := range ddNodes(t, d) {
					op := func(l *List) (bool, error) { return l.Join(n) }
					history = append(history, op)
					out = append(out, result(op(l)))
				}
				return strings.Join(out, "\n")
			case "state":
				var id uint64
				var to string
				d.ScanArgs(t, "id", &id)
				d.ScanArgs(t, "to", &to)
				s, err := ParseState(to)
				if err != nil {
					return result(false, err)
				}
				op := func(l *List) (bool, error) { return l.SetState(id, s) }
				history = append(history, op)
				return result(op(l))
			case "list":
				return ddList(l)
			case "replay":
				c := &List{}
				if err := c.Seed(l.Founding()); err != nil {
					return result(false, err)
				}
				for _, op := range history {
					op(c)
				}
				if ddList(c) != ddList(l) {
					return "differs:\n" + ddList(c)
				}
				return "equal=true"
			}
			t.Fatalf("unknown command %q", d.Cmd)
			return ""
		})
	})
}

func result(changed bool, err error) string {
	if err != nil {
		return "error: " + err.Error()
	}
	return fmt.Sprintf("ok changed=%v", changed)
}

func ddNodes(t *testing.T, d *datadriven.TestData) []Node {
	var out []Node
	for _, line := range strings.Split(strings.TrimSpace(d.Input), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			t.Fatalf("node line %q: want id addr [zone]", line)
		}
		var n Node
		if _, err := fmt.Sscan(f[0], &n.ID); err != nil {
			t.Fatalf("node line %q: %v", line, err)
		}
		n.Addr = f[1]
		if len(f) > 2 {
			n.Zone = f[2]
		}
		out = append(out, n)
	}
	return out
}

func ddList(l *List) string {
	var b strings.Builder
	for _, n := range l.Nodes() {
		fmt.Fprintf(&b, "%d %s zone=%q %s seed=%v\n", n.ID, n.Addr, n.Zone, n.State, n.Seed)
	}
	return strings.TrimRight(b.String(), "\n")
}
