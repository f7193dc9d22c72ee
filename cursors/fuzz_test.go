package cursors

import (
	"bytes"
	"testing"
)

// FuzzDecode feeds Decode arbitrary records and tombstones: it must never
// panic, and a record it accepts must re-encode to exactly its bytes (one encoding per
// value, so replicas and compaction agree byte for byte).
func FuzzDecode(f *testing.F) {
	g := &Group{Name: "g", Stream: "orders", RangeCount: 8, Epoch: 1<<40 | 5, AssignmentEpoch: 1<<40 | 4, Members: []Member{
		{ID: "a", InstanceID: "pod-a", Epoch: 1<<40 | 5, JoinEpoch: 1<<40 | 1, SessionTimeoutMillis: 10000, RebalanceTimeoutMillis: 30000,
			Target: []uint32{0, 1, 2, 3}, Owned: []uint32{0, 1, 2, 3, 7}, Revoking: []uint32{7}},
		{ID: "b", Epoch: 1<<40 | 4, JoinEpoch: 1<<40 | 4, SessionTimeoutMillis: 500, RebalanceTimeoutMillis: 500, Away: true,
			Target: []uint32{4, 5, 6, 7}, Owned: []uint32{4, 5}},
	}}
	for _, r := range []Record{
		EncodeGroup(g),
		EncodeGroup(&Group{Name: "x", Deleted: true, Epoch: 3}),
		EncodePosition("dev-1", Position{Stream: "chat", Range: 3, Generation: 2, Offset: 1 << 50, Epoch: 7, CommitTimeUnixNanos: -5,
			MemberID: "a", MemberEpoch: 9, Metadata: []byte("m")}),
		EncodePosition("c", Position{Stream: "s", Deleted: true}),
	} {
		f.Add(r.Key, r.Value, r.Tombstone)
	}
	f.Fuzz(func(t *testing.T, key, value []byte, tombstone bool) {
		d, err := Decode(Record{Key: key, Value: value, Tombstone: tombstone})
		if err != nil {
			return
		}
		var again Record
		if d.Position != nil {
			again = EncodePosition(d.Cursor, *d.Position)
		} else {
			again = EncodeGroup(d.Group)
		}
		if !bytes.Equal(again.Key, key) || !bytes.Equal(again.Value, value) || again.Tombstone != tombstone {
			t.Fatalf("re-encoding differs:\nkey   %x\n      %x\nvalue %x\n      %x\ntombstone %t, %t", key, again.Key, value, again.Value, tombstone, again.Tombstone)
		}
		// A decoded record applies to a state without trouble.
		if err := NewState(Limits{}).Apply(Record{Key: key, Value: value, Tombstone: tombstone}); err != nil {
			t.Fatalf("apply of a decoded record: %v", err)
		}
	})
}
