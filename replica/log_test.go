package replica

import (
	"bytes"
	"testing"

	"github.com/geolog/geolog/batch"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// TestFrameEntryRoundTrip: every entry a replica stores as a frame reads
// back from the log as the entry Raft proposed (Raft reads committed
// entries back from storage once they are stable, and on a restart).
func TestFrameEntryRoundTrip(t *testing.T) {
	data := batch.Encode(nil, batch.Header{BaseOffset: 7, Epoch: 2}, []batch.Record{{Key: []byte("k"), Value: []byte("v")}})
	marker := batch.EncodeCompaction(nil, batch.Header{BaseOffset: 8, Epoch: 2}, batch.Compaction{Point: 8, TombstoneCutoffUnixNanos: 5})
	for name, e := range map[string]*raftpb.Entry{
		"data":       {Term: proto.Uint64(3), Index: proto.Uint64(11), Type: raftpb.EntryNormal.Enum(), Data: data},
		"compaction": {Term: proto.Uint64(3), Index: proto.Uint64(12), Type: raftpb.EntryNormal.Enum(), Data: marker},
		"noop":       {Term: proto.Uint64(4), Index: proto.Uint64(13), Type: raftpb.EntryNormal.Enum()},
		"config":     {Term: proto.Uint64(4), Index: proto.Uint64(14), Type: raftpb.EntryConfChangeV2.Enum(), Data: []byte{1, 2, 3}},
	} {
		t.Run(name, func(t *testing.T) {
			frame, h, err := entryFrame(e, 9, 2, 100)
			if err != nil {
				t.Fatal(err)
			}
			if h.Term != e.GetTerm() || h.Index != e.GetIndex() {
				t.Fatalf("header term/index %d/%d, want %d/%d", h.Term, h.Index, e.GetTerm(), e.GetIndex())
			}
			got, err := frameEntry(frame)
			if err != nil {
				t.Fatalf("frameEntry: %v", err)
			}
			if got.GetTerm() != e.GetTerm() || got.GetIndex() != e.GetIndex() || got.GetType() != e.GetType() {
				t.Fatalf("entry %v, want %v", got, e)
			}
			if e.GetType() == raftpb.EntryNormal && len(e.Data) > 0 {
				// The stored frame carries the entry's term and index.
				want := append([]byte(nil), e.Data...)
				batch.PatchRaft(want, e.GetTerm(), e.GetIndex())
				if !bytes.Equal(got.Data, want) {
					t.Fatalf("data differs from the proposed frame")
				}
			} else if !bytes.Equal(got.Data, e.Data) {
				t.Fatalf("data %x, want %x", got.Data, e.Data)
			}
		})
	}
}
