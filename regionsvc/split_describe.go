package regionsvc

import (
	"github.com/geolog/geolog/keyspace"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
)

// describeSplit fills ri's place in the stream's range map from r: its
// parent, and once it split its children and split offset.
func describeSplit(ri *geologv1.RangeInfo, r keyspace.Range) {
	if r.Parent != keyspace.NoRange {
		p := r.Parent
		ri.Parent = &p
	}
	if r.IsSplit() {
		off := r.SplitOffset
		ri.Children, ri.SplitOffset = []uint32{r.Left, r.Right}, &off
	}
}
