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
	// keyNext is, per producer, the next record number of its key (the
	// first split's only: it counts along the key's whole lineage).
	keyNext map[int]uint64
	// parentNext is, per producer, the records of its key in the parent
	// and its ancestors (below their split offsets); last, per child and
	// producer, the number of the last record of the key the child
	// committed.
	parentNext map[int]uint64
	last       [2]map[int]uint64
	// resplit: whether a child splits again was drawn.
	resplit bool
	// faultAt is when a fault aimed at a child's leader strikes (-1:
	// none): a crash or a partition, 0-300 ms after the children open.
	faultAt int64
}

func newChildren(s *splitWorld) children {
	k := children{s: s, openAt: -1, faultAt: -1, pending: map[int][]string{}, keyNext: map[int]uint64{},
		last: [2]map[int]uint64{{}, {}}}
	if !s.on {
		return k
	}
	var hs []uint64
	for id := 1; id <= s.w.opt.Producers; id++ {
		if h := keyHash(id); h >= s.lo && h <= s.hi {
			hs = append(hs, h)
		}
	}
	slices.Sort(hs)
	k.at = s.lo + (s.hi-s.lo)/2 + 1
	if len(hs) > 1 {
		k.at = hs[1+s.rng.IntN(len(hs)-1)]
	}
	return k
}

func keyHash(pid int) uint64 { return keyspace.Hash([]byte(fmt.Sprintf("p%d", pid))) }

// root is the first split.
func (s *splitWorld) root() *splitWorld {
	for s.parent != nil {
		s = s.parent
	}
	return s
}

// childOf is the split range r is a child of (nil: none).
func (s *splitWorld) childOf(r int) *splitWorld {
	for x := s.root(); x != nil; x = x.sub {
		if x.on && (r == x.c0 || r == x.c0+1) {
			return x
		}
	}
	return nil
}

// child reports whether range r is a child of a split.
func (s *splitWorld) child(r int) bool { return s.childOf(r) != nil }

// trueOwner is the child of s owning key p<pid> (its range; -1: the key
// is not in the range that splits).
func (s *splitWorld) trueOwner(pid int) int {
	h := keyHash(pid)
	switch {
	case h < s.lo || h > s.hi:
		return -1
	case h < s.kids.at:
		return s.c0
	}
	return s.c0 + 1
}

// route is the range producer p sends its key's batches to: the active
// range owning its hash in the stream's range map as the splits whose
// children opened made it (keyspace.RangeMap.Lookup, as the SDK routes).
func (s *splitWorld) route(p *producer) int {
	root := s.root()
	id := root.rmap.Lookup(keyHash(p.pid(root.r)))
	if r, _ := root.rmap.Get(id); r.Parent != keyspace.NoRange && s.w.opt.mut.child == childWrongRoute {
		parent, _ := root.rmap.Get(r.Parent)
		id = parent.Left + parent.Right - id // its sibling
	}
	return root.simID(id)
}

// simID is the simulator's range of range map id (the map holds range 0
// and the splits' children: ids 1, 2, ... are ranges Ranges, Ranges+1, ...).
func (s *splitWorld) simID(id uint32) int {
	if id == 0 {
		return s.root().r
	}
	return int(id) + s.w.opt.Ranges - 1
}

// mapID is range r's id in the range map.
func (s *splitWorld) mapID(r int) uint32 {
	if r == s.root().r {
		return 0
	}
	return uint32(r - s.w.opt.Ranges + 1)
}

// peers are a child's first voters (nil: the default, 1..Nodes).
func (s *splitWorld) peers(r int) []uint64 {
	if x := s.childOf(r); x != nil {
		return x.kids.voters
	}
	return nil
}

// member reports whether node id is in range r's latest configuration.
func (s *splitWorld) member(r int, id uint64) bool {
	if x := s.childOf(r); x != nil && !s.w.moves.on {
		return slices.Contains(x.kids.voters, id)
	}
	return s.w.moves.member(r, id)
}

// accepts reports whether producer p may start a new batch on range r:
// on a range of the splits' lineage, only on the one its key routes to,
// not once it split, and while no batch of the key is unanswered or
// waits to move.
func (s *splitWorld) accepts(p *producer, r int) bool {
	switch {
	case !s.on || (r != s.r && !s.child(r)):
		return true
	case s.of(r) != nil && s.of(r).ended(r):
		return false
	case r != s.route(p):
		return false
	}
	return s.w.opt.mut.child == childEarly || !s.keyBusy(p)
}

// keyBusy reports whether producer p has a batch of its key unanswered
// on a range of the splits, or waiting to move to a child.
func (s *splitWorld) keyBusy(p *producer) bool {
	for x := s.root(); x != nil; x = x.sub {
		if !x.on {
			continue
		}
		if x.kids.pending[p.id] != nil || p.batch[x.r] != nil {
			return true
		}
		for c := x.c0; x.kids.open && c < x.c0+2; c++ {
			if p.batch[c] != nil {
				return true
			}
		}
	}
	return false
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
		return recordName(p.pid(r), s.r, n)
	}
	return recordName(p.pid(r), r, seq)
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
func (s *splitWorld) busy() bool {
	for x := s; x != nil; x = x.sub {
		if len(x.kids.pending) > 0 {
			return true
		}
	}
	return false
}

// stepChildren opens the children when due, sends the batches that wait
// for them and, one first split in two, splits a child again.
func (s *splitWorld) stepChildren() {
	w, k := s.w, &s.kids
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
		c := s.route(p)
		if p.batch[c] != nil {
			continue // childEarly: one is in flight already
		}
		b := &inflight{seq: p.nextSeq[c], values: vals, target: 1 + s.rng.IntN(w.opt.Nodes)}
		p.batch[c] = b
		delete(k.pending, p.id)
		w.tracef("producer %d: batch %v refused by the split goes to range %d", p.id, vals, c)
		w.sendRequest(p, c, b)
	}
	if k.faultAt >= 0 && w.now >= k.faultAt {
		k.faultAt = -1
		s.aimFault()
	}
	if s.parent == nil && !k.resplit {
		k.resplit = true
		s.splitAgain()
	}
}

// aimFault crashes or cuts off the leader of one of the children (or,
// with none, one of their voters), while the faults run.
func (s *splitWorld) aimFault() {
	w := s.w
	if w.now >= int64(w.opt.Steps) {
		return
	}
	c := s.c0 + s.rng.IntN(2)
	n := w.leaderOf(0, c)
	if n == nil {
		n = w.node(0, int(s.kids.voters[s.rng.IntN(len(s.kids.voters))]))
	}
	if s.rng.IntN(2) == 0 {
		if n.up {
			w.tracef("%s: crash aimed at range %d, a child of the split", traceName(n), c)
			w.crash(n)
			s.res.ChildFaults++
		}
		return
	}
	w.tracef("%s: partition aimed at range %d, a child of the split", traceName(n), c)
	n.cutTill = w.now + 100 + s.rng.Int64N(1500)
	w.res.Partitions++
	s.res.ChildFaults++
}

// splitAgain, one first split in two (every one with the resplit
// mutation), splits the child with more of the producers' keys later in
// the faults.
func (s *splitWorld) splitAgain() {
	w := s.w
	if !(s.rng.IntN(2) == 0 || w.opt.mut.resplitAlways) || w.now+300 >= int64(w.opt.Steps) {
		return
	}
	keys := [2]int{}
	for id := 1; id <= w.opt.Producers; id++ {
		keys[s.trueOwner(id)-s.c0]++
	}
	x := &splitWorld{w: w, rng: s.rng, on: true, r: s.c0, answered: -1, offset: -1, abandoned: map[string]bool{},
		parent: s, c0: len(w.canonical), lo: s.lo, hi: s.kids.at - 1, version: s.version + 1}
	if keys[1] > keys[0] {
		x.r, x.lo, x.hi = s.c0+1, s.kids.at, s.hi
	}
	x.at = w.now + 100 + s.rng.Int64N(int64(w.opt.Steps)-w.now-200)
	x.next = x.at
	x.kids = newChildren(x)
	s.sub = x
	w.tracef("range %d: splits again at %d ms", x.r, x.at)
}

// openChildren opens the two children: every table of a range grows by
// two, and every live node opens its replicas of them.
func (s *splitWorld) openChildren() error {
	w, k := s.w, &s.kids
	k.open = true
	if s.parent == nil {
		s.res.Children = 1
	} else {
		s.res.Resplit = 1
	}
	k.voters = nil
	if w.moves.on {
		k.voters = slices.Clone(w.moves.conf[s.r].GetVoters())
	}
	if len(k.voters) == 0 {
		for id := 1; id <= w.opt.Nodes; id++ {
			k.voters = append(k.voters, uint64(id))
		}
	}
	if len(w.canonical) != s.c0 {
		return fmt.Errorf("range %d: its children would be ranges %d and %d, the ranges are %d", s.r, s.c0, s.c0+1, len(w.canonical))
	}
	root := s.root()
	m, err := root.rmap.Split(root.mapID(s.r), k.at, uint64(s.offset))
	if err == nil {
		err = m.Validate()
	}
	if err != nil {
		return fmt.Errorf("range %d: the range map does not take its split at %#x: %w", s.r, k.at, err)
	}
	if l, _ := root.rmap.NextIDs(); root.simID(l) != s.c0 {
		return fmt.Errorf("range %d: the range map's children start at %d, the simulator's at range %d", s.r, l, s.c0)
	}
	root.rmap = m
	w.tracef("range %d: split at hash %#x; children %d and %d open on %v", s.r, k.at, s.c0, s.c0+1, k.voters)
	if s.rng.IntN(2) == 0 {
		k.faultAt = w.now + s.rng.Int64N(300)
	}
	for i := 0; i < 2; i++ {
		w.canonical = append(w.canonical, nil)
		w.acked = append(w.acked, map[uint64]string{})
		w.ackedEnds = append(w.ackedEnds, 0)
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
		n.drivers = append(n.drivers, nil, nil)
		n.verified, n.writing = append(n.verified, 0, 0), append(n.writing, false, false)
		n.mirror = append(n.mirror, mirrorQueue{}, mirrorQueue{})
		n.gates = append(n.gates, make([]rangecore.StartGate[*gateOp], 2)...)
		n.timelines = append(n.timelines, make([]rangecore.Timeline, 2)...)
		n.epochs, n.fresh = append(n.epochs, 0, 0), append(n.fresh, 0, 0)
		n.divergence, n.tailChecked = append(n.divergence, divergence{}, divergence{}), append(n.tailChecked, 0, 0)
		for c := s.c0; c < s.c0+2; c++ {
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
	w := s.w
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
	x := s.childOf(c)
	pid, n, err := x.checkChild(c, off, v)
	if err != nil {
		return err
	}
	if err := s.canonize(c, off, v); err != nil {
		return err // c split in turn: split.go's checks of a parent
	}
	if a, ok := w.acked[c][off]; ok && a != v {
		return fmt.Errorf("range %d offset %d: acked %q, committed %q", c, off, a, v)
	}
	x.kids.last[c-x.c0][pid] = n
	w.seen[c][v] = off
	w.canonical[c] = append(canon, v)
	x.res.ChildRecords++
	return nil
}

// checkChild checks record v, committed at off in s's child c, against
// the split: its key, where else it is, and the key's order.
func (s *splitWorld) checkChild(c int, off uint64, v string) (int, uint64, error) {
	w, k, root := s.w, &s.kids, s.root().r
	var pid, rr int
	var n uint64
	if err := scanRecord(v, &pid, &rr, &n); err != nil || rr != root {
		return 0, 0, fmt.Errorf("range %d offset %d: foreign record %q (a child holds records of range %d's keys, named there)", c, off, v, root)
	}
	i, other := c-s.c0, 2*s.c0+1-c
	if h := keyHash(pid); s.trueOwner(pid) != c {
		return 0, 0, fmt.Errorf("range %d offset %d: %q, whose key p%d hashes to %#x, is in the child that does not own it (range %d owns [%#x, %#x], split at %#x)", c, off, v, pid, h, s.r, s.lo, s.hi, k.at)
	}
	if _, ok := k.last[1-i][pid]; ok {
		return 0, 0, fmt.Errorf("range %d offset %d: key p%d has records in both children %d and %d", c, off, pid, c, other)
	}
	for x := s; x != nil; x = x.parent {
		if at, ok := w.seen[x.r][v]; ok {
			return 0, 0, fmt.Errorf("range %d offset %d: %q is in range %d too, at %d (below its split offset %d)", c, off, v, x.r, at, x.offset)
		}
	}
	if at, ok := w.seen[c][v]; ok {
		return 0, 0, fmt.Errorf("range %d: %q committed twice, at %d and %d", c, v, at, off)
	}
	if s.offset < 0 || uint64(len(w.canonical[s.r])) != uint64(s.offset) {
		return 0, 0, fmt.Errorf("range %d offset %d: %q committed before the parent's log up to its split offset was (parent %d read to %d, split at %d)", c, off, v, s.r, len(w.canonical[s.r]), s.offset)
	}
	want := s.parentRecords(pid)
	if last, ok := k.last[i][pid]; ok {
		want = last + 1
	}
	if n != want {
		return 0, 0, fmt.Errorf("range %d offset %d: key p%d's record %d after its record %d (range %d and its ancestors hold %d of its records below their split offsets): per-key order broken across the split",
			c, off, pid, n, int64(want)-1, s.r, s.parentRecords(pid))
	}
	return pid, n, nil
}

// parentRecords is the number of records of producer pid's key in the
// range that split and its ancestors, below their split offsets (read
// once their logs are whole).
func (s *splitWorld) parentRecords(pid int) uint64 {
	k := &s.kids
	if k.parentNext == nil {
		k.parentNext = map[int]uint64{}
		for x := s; x != nil; x = x.parent {
			for _, v := range s.w.canonical[x.r] {
				var p, rr int
				var n uint64
				if err := scanRecord(v, &p, &rr, &n); err == nil {
					k.parentNext[p] = max(k.parentNext[p], n+1)
				}
			}
		}
	}
	return k.parentNext[pid]
}

// finalChildren: a reader of each key, finishing each range that split
// up to its split offset, then reading the child owning the key, gets
// every record the key's producer named, in order, once; the other
// child holds none.
func (s *splitWorld) finalChildren() error {
	w := s.w
	if !s.on || s.offset < 0 {
		return nil
	}
	for x := s; x != nil; x = x.sub {
		if x.offset >= 0 && !x.kids.open {
			return fmt.Errorf("range %d: split at %d, its children never opened", x.r, x.offset)
		}
	}
	for _, p := range w.prods {
		pid := p.pid(s.r)
		key := fmt.Sprintf("p%d/", pid)
		var got []string
		for x := s; x != nil; x = x.sub {
			if c := x.trueOwner(pid); c >= 0 {
				if _, ok := x.kids.last[1-(c-x.c0)][pid]; ok {
					return fmt.Errorf("key p%d: records in range %d, which does not own it", pid, 2*x.c0+1-c)
				}
			}
		}
		// The reader's path: the key's range in the final map, after its
		// ancestors (keyspace.RangeMap.Ancestors, nearest first).
		leaf := s.rmap.Lookup(keyHash(pid))
		path := []int{s.simID(leaf)}
		for _, a := range s.rmap.Ancestors(leaf) {
			path = append([]int{s.simID(a)}, path...)
		}
		for _, r := range path {
			for _, v := range w.canonical[r] {
				if strings.HasPrefix(v, key) {
					got = append(got, v)
				}
			}
		}
		for i, v := range got {
			if want := fmt.Sprintf("p%d/r%d/s%d", pid, s.r, i); v != want {
				return fmt.Errorf("key p%d read across the splits (ranges %v, each to its split offset): record %d is %q, want %q", pid, path, i, v, want)
			}
		}
		if uint64(len(got)) != s.kids.keyNext[p.id] {
			return fmt.Errorf("key p%d read across the splits (ranges %v): %d records, its producer named %d", pid, path, len(got), s.kids.keyNext[p.id])
		}
	}
	return nil
}
