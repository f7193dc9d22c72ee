package segment

// SegmentInfo describes one segment of a log.
type SegmentInfo struct {
	// BaseOffset is the offset of the segment's first record (its name);
	// NextOffset the offset after its last record.
	BaseOffset, NextOffset uint64
	// FirstIndex and LastIndex are the Raft indexes of its first and last
	// frames carrying one, LastTerm the term at LastIndex (0 if none).
	FirstIndex, LastIndex, LastTerm uint64
	// Bytes is the size of the segment's log file.
	Bytes int64
	// MaxAppendTimeUnixNanos is its newest append time (meaningful when
	// Bytes > 0).
	MaxAppendTimeUnixNanos int64
}

func infoOf(g *segment) SegmentInfo {
	return SegmentInfo{BaseOffset: g.baseOffset, NextOffset: g.nextOffset,
		FirstIndex: g.firstIndex, LastIndex: g.lastIndex, LastTerm: g.lastTerm,
		Bytes: g.size, MaxAppendTimeUnixNanos: g.maxAppendTimeUnixNanos}
}

// RetentionCandidates returns, oldest first, the segments ApplyRetention
// would delete now, and deletes nothing: a Raft replica deletes only those
// whose frames it has applied, after recording the compaction point (see
// package replica). Like ApplyRetention it first rolls the active segment
// when every frame of the log has expired by age, so that the whole log can
// go; the active segment itself is never a candidate. Delete a prefix of
// the candidates with DeletePrefix(candidate.NextOffset). For the appender
// goroutine.
func (s *Store) RetentionCandidates() ([]SegmentInfo, error) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if err := s.usableLocked(); err != nil {
		return nil, err
	}
	if s.cfg.RetentionAge <= 0 && s.cfg.RetentionBytes <= 0 {
		return nil, nil
	}
	cutoff := s.cfg.Now().Add(-s.cfg.RetentionAge).UnixNano()
	expired := func(g *segment) bool {
		return s.cfg.RetentionAge > 0 && g.size > 0 && g.maxAppendTimeUnixNanos < cutoff
	}
	if g := s.active(); expired(g) && g.hasRecords() {
		if err := s.roll(); err != nil {
			return nil, err
		}
	}
	// Age first, then size, oldest first: what ApplyRetention's two passes
	// delete, since append times do not decrease along the log.
	var out []SegmentInfo
	size := s.sizeBytes.Load()
	for _, g := range s.segs[:len(s.segs)-1] {
		if !expired(g) && (s.cfg.RetentionBytes <= 0 || size <= s.cfg.RetentionBytes) {
			break
		}
		out = append(out, infoOf(g))
		size -= g.size
	}
	return out, nil
}
