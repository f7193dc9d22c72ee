package regionsvc

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/geolog/geolog/authz"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
)

// TestCommitCursorsNeedsOncePerStream: a commit's needs are the group
// permission on its cursor and consume on each stream its positions name,
// in the order they first appear after one another: a subsequence of one
// need per position (so the first need a caller lacks, which the refusal
// names, is the same) with the same set, and one consume need for a commit
// of one stream's ranges.
func TestCommitCursorsNeedsOncePerStream(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(5, 6))
	for i := range 300 {
		req := &geologv1.CommitCursorsRequest{Cursor: "g"}
		for range rng.IntN(40) {
			req.Positions = append(req.Positions, &geologv1.CursorPosition{Stream: fmt.Sprintf("s%d", rng.IntN(3)), Range: rng.Uint32N(8)})
		}
		perPosition := []need{{authz.Group, "g"}}
		for _, p := range req.Positions {
			perPosition = append(perPosition, need{authz.Consume, p.GetStream()})
		}
		got := commitCursorsNeeds(req)
		rest := perPosition
		for _, nd := range got {
			j := slices.Index(rest, nd)
			if j < 0 {
				t.Fatalf("case %d: %v is not a subsequence of %v", i, got, perPosition)
			}
			rest = rest[j+1:]
		}
		for _, nd := range perPosition {
			if !slices.Contains(got, nd) {
				t.Fatalf("case %d: %v lacks %v", i, got, nd)
			}
		}
	}
	one := &geologv1.CommitCursorsRequest{Cursor: "g"}
	for r := range 64 {
		one.Positions = append(one.Positions, &geologv1.CursorPosition{Stream: "s", Range: uint32(r)})
	}
	if got := commitCursorsNeeds(one); len(got) != 2 {
		t.Fatalf("a commit of one stream's 64 ranges needs %v", got)
	}
}
