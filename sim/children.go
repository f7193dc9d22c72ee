package sim

import (
	"fmt"
	"slices"
	"strings"

	"github.com/geolog/geolog/keyspace"
	"github.com/geolog/geolog/rangecore"
	"go.etcd.io/raft/v3/raftpb"
)

// Splits, the children's side (Regions 1, every run that splits;
// docs/split.md). Once the checks see the parent's split marker
// committed, a catalogue round trip later (5-50 virtual ms) the two
// children open as Raft groups of their own, ranges Ranges and
// Ranges+1, on the parent's voters of the moment (its latest
// configuration with moves on, as regionsvc's catalogue record carries
// the parent's placed voters), each a replica.Replica over a
// segment.Store of its own on every live node, as regionsvc's applySplit
// opens them (openRange); a node down then opens them when it restarts,
// as it would on applying the catalogue. From then on they are ranges
// like the others: ticked, crashed, cut off, compacted under retention,
// snapshotted, and, with moves on, moved and drained by the planner.
//
// The split's boundary is drawn between the producers' keys (each
// producer writes one key, "p<id>"), so each child gets at least one.
// A producer whose batch the parent answered RANGE_SPLIT resends it, same
// records, to the child owning its key's hash (the SDK's refresh of its
// range map) as a new idempotent producer of the child; it starts no
// batch on the child while a batch of its key is unanswered on the
// parent or waits to move (one batch of a key in flight at a time, as
// the SDK keeps a key's order). A child's records keep the parent's
// names ("p<id>/r<parent>/s<n>": n counts the key's records from the
// parent's first on), so the checks read one key's order across both.
//
// Checks, as each child record is committed (canonizeChild): its key
// hashes into the child's half; its key has no record in the other
// child; it is in no other range (the parent below the split offset, the
// other child, this child at another offset); the key's records go on
// where the parent left them (n is the key's next: the parent's log is
// read whole, up to the marker, before any child opens). At the end
// (finalChildren): a reader finishing the parent up to its split offset
// and then reading the child owning the key gets every record of the key
// ever named, in order, once (acked ones included: each producer's last
// batch was acked before the end). The checks the simulator runs on every
// range hold for the children too (invariant 8: no node publishes less
// than before; epochs never go back; acked records present at their
// offsets; every member commits the same log).
//
// Each check has a broken variant (mutations.child, children_test.go).

// childMutation breaks the children's side on purpose (tests).
type childMutation int

const (
	childOK childMutation = iota
	// childWrongRoute: producers send their key's batches to the child
	// that does not own its hash.
	childWrongRoute
	// childEarly: a producer starts batches on its child while a batch
	// of its key is still unanswered on the parent (the refused one then
	// lands after later records of the key).
	childEarly
	// childOpenEarly: the children open when the marker is proposed, not
	// once it committed (the parent may still commit records of a key
	// that already has records in a child).
	childOpenEarly
)

type children struct {
	s  *splitWorld
	at uint64 // the boundary: the left child owns hashes below it
	// openAt is when the children open (-1: not due); open whether they
	// did; voters their first voters.
	openAt int64
	open   bool
	voters []uint64
	// pending is, per producer, a batch the parent answered RANGE_SPLIT
	// before the children opened.
	pending map[int][]string
	// keyNext is, per producer, the next record number of its key.
	keyNext map[int]uint64
	// parentNext is, per producer, the records of its key in the parent
	// (below the split offset); last, per child and producer, the number
	// of the last record of the key the child committed.
	parentNext map[int]uint64
	last       [2]map[int]uint64
}

func newChildren(s *splitWorld) children {
	k := children{s: s, openAt: -1, pending: map[int][]string{}, keyNext: map[int]uint64{},
		last: [2]map[int]uint64{{}, {}}}
	if !s.on {
		return k
	}
	var hs []uint64
	for id := 1; id <= s.w.opt.Producers; id++ {
		hs = append(hs, keyHash(id))
	}
	slices.Sort(hs)
	k.at = 1 << 63
	if len(hs) > 1 {
		k.at = hs[1+s.rng.IntN(len(hs)-1)]
	}
	return k
}

func keyHash(pid int) uint64 { return keyspace.Hash([]byte(fmt.Sprintf("p%d", pid))) }

// child reports whether range r is a child of the split.
func (s *splitWorld) child(r int) bool { return s.on && r >= s.w.opt.Ranges }

// trueOwner is the child owning key p<pid> (its range index).
func (s *splitWorld) trueOwner(pid int) int {
	c := s.w.opt.Ranges
	if keyHash(pid) >= s.kids.at {
		c++
	}
	return c
}

// owner is the child producer p sends its key's batches to.
func (s *splitWorld) owner(p *producer) int {
	c := s.trueOwner(p.pid(s.r))
	if s.w.opt.mut.child == childWrongRoute {
		c = 2*s.w.opt.Ranges + 1 - c
	}
	return c
}

// peers are a child's first voters (nil: the default, 1..Nodes).
func (s *splitWorld) peers(r int) []uint64 {
	if s.child(r) {
		return s.kids.voters
	}
	return nil
}

// member reports whether node id is in range r's latest configuration.
func (s *splitWorld) member(r int, id uint64) bool {
	if s.child(r) && !s.w.moves.on {
		return slices.Contains(s.kids.voters, id)
	}
	return s.w.moves.member(r, id)
}

// accepts reports whether producer p may start a new batch on range r.
func (s *splitWorld) accepts(p *producer, r int) bool {
	switch {
	case !s.on:
		return true
	case r == s.r:
		return !s.ended(r)
	case !s.child(r):
		return true
	case r != s.owner(p):
		return false
	case s.w.opt.mut.child == childEarly:
		return true
	}
	return p.batch[s.r] == nil && s.kids.pending[p.id] == nil
}

// name is the value of producer p's record of sequence seq on range r:
// on a child, its key's next record number.
func (s *splitWorld) name(p *producer, r int, seq uint64) string {
	k := &s.kids
	switch {
	case s.on && r == s.r:
		k.keyNext[p.id] = max(k.keyNext[p.id], seq+1)
	case s.child(r):
		n := k.keyNext[p.id]
		k.keyNext[p.id] = n + 1
		return fmt.Sprintf("p%d/r%d/s%d", p.pid(r), s.r, n)
	}
	return fmt.Sprintf("p%d/r%d/s%d", p.pid(r), r, seq)
}

// moveToChild takes a batch the parent answered RANGE_SPLIT to the
// child owning its key, once the children are open.
func (s *splitWorld) moveToChild(p *producer, b *inflight) {
	s.kids.pending[p.id] = b.values
	s.res.Moved++
}

// committed: the checks saw the marker committed; the catalogue opens
// the children a round trip later.
func (s *splitWorld) committed() {
	if s.kids.openAt < 0 {
		s.kids.openAt = s.w.now + 5 + s.rng.Int64N(45)
	}
}

// busy: a batch waits for the children.
func (s *splitWorld) busy() bool { return len(s.kids.pending) > 0 }

// stepChildren opens the children when due and sends the batches that
// wait for them.
func (s *splitWorld) stepChildren() {
	w, k := s.w, &s.kids
	if !k.open && w.opt.mut.child == childOpenEarly && s.res.Proposed > 0 && k.openAt < 0 {
		k.openAt = w.now
	}
	if !k.open && k.openAt >= 0 && w.now >= k.openAt {
		if w.err = s.openChildren(); w.err != nil {
			return
		}
	}
	if !k.open {
		return
	}
	for _, p := range w.prods {
		vals := k.pending[p.id]
		if vals == nil {
			continue
		}
		c := s.owner(p)
		if p.batch[c] != nil {
			continue // childEarly: one is in flight already
		}
		b := &inflight{seq: p.nextSeq[c], values: vals, target: 1 + s.rng.IntN(w.opt.Nodes)}
		p.batch[c] = b
		delete(k.pending, p.id)
		w.tracef("producer %d: batch %v refused by the split goes to range %d", p.id, vals, c)
		w.sendRequest(p, c, b)
	}
}

// openChildren opens the two children: every table of a range grows by
// two, and every live node opens its replicas of them.
func (s *splitWorld) openChildren() error {
	w, k := s.w, &s.kids
	k.open = true
	s.res.Children = 1
	k.voters = nil
	if w.moves.on {
		k.voters = slices.Clone(w.moves.conf[s.r].GetVoters())
	}
	if len(k.voters) == 0 {
		for id := 1; id <= w.opt.Nodes; id++ {
			k.voters = append(k.voters, uint64(id))
		}
	}
	w.tracef("range %d: split at hash %#x; children %d and %d open on %v", s.r, k.at, w.opt.Ranges, w.opt.Ranges+1, k.voters)
	for i := 0; i < 2; i++ {
		w.canonical = append(w.canonical, nil)
		w.acked = append(w.acked, map[uint64]string{})
		w.lastSeq = append(w.lastSeq, map[int]int64{})
		w.seen = append(w.seen, map[string]uint64{})
		w.leaders = append(w.leaders, 0)
		w.canonFrames = append(w.canonFrames, map[uint64][]byte{})
		w.homeCommitted = append(w.homeCommitted, 0)
		w.lastEpoch = append(w.lastEpoch, baseEpoch{})
	}
	if m := w.moves; m.on {
		for i := 0; i < 2; i++ {
			conf := &raftpb.ConfState{Voters: slices.Clone(k.voters)}
			members := map[uint64]bool{}
			for _, id := range k.voters {
				members[id] = true
			}
			m.conf, m.applied, m.members, m.asking = append(m.conf, conf), append(m.applied, 0), append(m.members, members), append(m.asking, 0)
		}
	}
	for _, p := range w.prods {
		p.nextSeq, p.batch = append(p.nextSeq, 0, 0), append(p.batch, nil, nil)
		p.inc, p.home = append(p.inc, 0, 0), append(p.home, 0, 0)
	}
	for _, n := range w.nodes {
		n.served, n.forkEpoch, n.logStart = append(n.served, 0, 0), append(n.forkEpoch, 0, 0), append(n.logStart, 0, 0)
		if !n.up {
			continue // it opens them when it starts
		}
		n.stores, n.replicas = append(n.stores, nil, nil), append(n.replicas, nil, nil)
		n.verified, n.writing, n.marking = append(n.verified, 0, 0), append(n.writing, false, false), append(n.marking, false, false)
		n.mirror = append(n.mirror, mirrorQueue{}, mirrorQueue{})
		n.gates = append(n.gates, make([]rangecore.StartGate[*gateOp], 2)...)
		n.timelines = append(n.timelines, make([]rangecore.Timeline, 2)...)
		n.epochs, n.fresh = append(n.epochs, 0, 0), append(n.fresh, 0, 0)
		n.divergence, n.tailChecked = append(n.divergence, divergence{}, divergence{}), append(n.tailChecked, 0, 0)
		for c := w.opt.Ranges; c < w.opt.Ranges+2; c++ {
			if err := w.openReplica(n, c); err != nil {
				return err
			}
		}
	}
	return nil
}

// canonizeChild checks a record child c committed at off and adds it to
// the child's log.
func (s *splitWorld) canonizeChild(c int, off uint64, v string) error {
	w, k := s.w, &s.kids
	canon := w.canonical[c]
	if off < uint64(len(canon)) {
		if canon[off] != v {
			return fmt.Errorf("range %d offset %d: committed %q here, %q elsewhere", c, off, v, canon[off])
		}
		return nil
	}
	if off != uint64(len(canon)) {
		return fmt.Errorf("range %d: committed offset %d after %d: a gap", c, off, len(canon))
	}
	var pid, rr int
	var n uint64
	if _, err := fmt.Sscanf(v, "p%d/r%d/s%d", &pid, &rr, &n); err != nil || rr != s.r {
		return fmt.Errorf("range %d offset %d: foreign record %q (a child holds records of its parent %d's keys)", c, off, v, s.r)
	}
	i, other := c-w.opt.Ranges, 2*w.opt.Ranges+1-c
	h := keyHash(pid)
	if (i == 0) != (h < k.at) {
		return fmt.Errorf("range %d offset %d: %q, whose key p%d hashes to %#x, is in the child that does not own it (split at %#x)", c, off, v, pid, h, k.at)
	}
	if _, ok := k.last[1-i][pid]; ok {
		return fmt.Errorf("range %d offset %d: key p%d has records in both children %d and %d", c, off, pid, c, other)
	}
	if at, ok := w.seen[s.r][v]; ok {
		return fmt.Errorf("range %d offset %d: %q is in the parent too, at %d (below its split offset %d)", c, off, v, at, s.offset)
	}
	if at, ok := w.seen[c][v]; ok {
		return fmt.Errorf("range %d: %q committed twice, at %d and %d", c, v, at, off)
	}
	if s.offset < 0 || uint64(len(w.canonical[s.r])) != uint64(s.offset) {
		return fmt.Errorf("range %d offset %d: %q committed before the parent's log up to its split offset was (parent read to %d, split at %d)", c, off, v, len(w.canonical[s.r]), s.offset)
	}
	want := s.parentRecords(pid)
	if last, ok := k.last[i][pid]; ok {
		want = last + 1
	}
	if n != want {
		return fmt.Errorf("range %d offset %d: key p%d's record %d after its record %d (the parent holds %d of its records below the split offset %d): per-key order broken across the split",
			c, off, pid, n, int64(want)-1, s.parentRecords(pid), s.offset)
	}
	if a, ok := w.acked[c][off]; ok && a != v {
		return fmt.Errorf("range %d offset %d: acked %q, committed %q", c, off, a, v)
	}
	k.last[i][pid] = n
	w.seen[c][v] = off
	w.canonical[c] = append(canon, v)
	s.res.ChildRecords++
	return nil
}

// parentRecords is the number of records of producer pid's key in the
// parent, below its split offset (read once the parent's log is whole).
func (s *splitWorld) parentRecords(pid int) uint64 {
	k := &s.kids
	if k.parentNext == nil {
		k.parentNext = map[int]uint64{}
		for _, v := range s.w.canonical[s.r] {
			var p, rr int
			var n uint64
			if _, err := fmt.Sscanf(v, "p%d/r%d/s%d", &p, &rr, &n); err == nil {
				k.parentNext[p] = max(k.parentNext[p], n+1)
			}
		}
	}
	return k.parentNext[pid]
}

// finalChildren: a reader of each key, finishing the parent up to its
// split offset, then reading the child owning the key, gets every record
// the key's producer named, in order, once; the other child holds none.
func (s *splitWorld) finalChildren() error {
	w, k := s.w, &s.kids
	if !s.on || s.offset < 0 {
		return nil
	}
	if !k.open {
		return fmt.Errorf("range %d: split at %d, its children never opened", s.r, s.offset)
	}
	for _, p := range w.prods {
		pid := p.pid(s.r)
		key := fmt.Sprintf("p%d/", pid)
		var got []string
		for _, r := range []int{s.r, s.trueOwner(pid)} {
			for _, v := range w.canonical[r] {
				if strings.HasPrefix(v, key) {
					got = append(got, v)
				}
			}
		}
		for i, v := range got {
			if want := fmt.Sprintf("p%d/r%d/s%d", pid, s.r, i); v != want {
				return fmt.Errorf("key p%d read across the split (parent %d to its offset %d, then its child): record %d is %q, want %q", pid, s.r, s.offset, i, v, want)
			}
		}
		if uint64(len(got)) != k.keyNext[p.id] {
			return fmt.Errorf("key p%d read across the split: %d records, its producer named %d", pid, len(got), k.keyNext[p.id])
		}
		for c := w.opt.Ranges; c < w.opt.Ranges+2; c++ {
			if _, ok := k.last[c-w.opt.Ranges][pid]; ok && c != s.trueOwner(pid) {
				return fmt.Errorf("key p%d: records in range %d, which does not own it", pid, c)
			}
		}
	}
	return nil
}
