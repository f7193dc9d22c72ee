package regionsvc

import (
	"crypto/tls"
	"testing"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/membership"
)

// TestMoveNeedsTLS: a member's id at another address is a move with TLS
// (authorizeJoin has checked the caller is that node) and NODE_ID_IN_USE
// without; with TLS, a move onto another node's address is
// ADDRESS_IN_USE; once
// moved, the recorded address wins over --peers. It fails if a move is
// taken without TLS, refused with it, or --peers keeps the old address.
func TestMoveNeedsTLS(t *testing.T) {
	t.Parallel()
	for _, secure := range []bool{true, false} {
		n := &Node{cfg: Config{Region: "local"}, region: &region{}}
		if secure {
			n.cfg.TLS = &tls.Config{}
		}
		n.region.members.list = &membership.List{}
		if err := n.region.members.list.Seed([]membership.Node{{ID: 1, Addr: "h:1"}, {ID: 2, Addr: "h:2"}}); err != nil {
			t.Fatal(err)
		}
		n.region.members.saved = n.region.members.list.Clone()
		move, err := n.checkJoinOrMove(membership.Node{ID: 1, Addr: "h:9"})
		if secure && (!move || err != nil) {
			t.Fatalf("with TLS: move %v, %v", move, err)
		}
		if !secure && (move || apierr.As(err).Code != apierr.NodeIDInUse) {
			t.Fatalf("without TLS: move %v, %v", move, err)
		}
		if _, err := n.checkJoinOrMove(membership.Node{ID: 1, Addr: "h:2"}); secure && apierr.As(err).Code != apierr.AddressInUse {
			t.Fatalf("secure %v, onto node 2's address: %v", secure, err)
		}
	}
	m := &memberTable{list: &membership.List{}}
	if err := m.list.Seed([]membership.Node{{ID: 1, Addr: "h:1"}, {ID: 2, Addr: "h:2"}}); err != nil {
		t.Fatal(err)
	}
	m.saved = m.list.Clone()
	static := map[uint64]string{1: "h:1", 2: "h:2"}
	if _, err := m.list.Move(membership.Node{ID: 1, Addr: "h:9"}); err != nil {
		t.Fatal(err)
	}
	if got := m.peerAddr(1, static); got != "h:9" {
		t.Fatalf("moved node 1 reached at %q, want h:9 (the record over --peers)", got)
	}
	if got := m.peerAddr(2, static); got != "h:2" {
		t.Fatalf("node 2 reached at %q", got)
	}
}
