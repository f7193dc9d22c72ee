package sim

import "go.etcd.io/raft/v3/raftpb"

// sendFloor carries a leader's compaction-floor message (replica
// floor.go) to its follower: lost to a partition or a crash like any
// other, but without a draw from the run's generator, so that the floor
// messages, which every compacting leader sends, leave the draws of the
// other messages, and with them the seeds found before they existed
// (TestDownDivergentCopyKeepsFloor, TestRetainedMirrorIsForked), as they
// were. The replica sends a floor again every few compaction rounds.
func (w *world) sendFloor(region, group int, m *raftpb.Message) {
	if w.cut(region, int(m.GetFrom())) || w.cut(region, int(m.GetTo())) {
		w.res.Dropped++
		return
	}
	w.push(w.raftEvent(w.now+1, region, group, int(m.GetTo()), cloneMessage(m)))
}
