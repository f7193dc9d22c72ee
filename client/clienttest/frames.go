package clienttest

import (
	"github.com/geolog/geolog/batch"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
)

// framesOf is recs in the frame form (ReadResponse.frames), as a node
// sends it: a run of records of consecutive offsets with one epoch and
// append time is one frame. Config.DamageFrames, if set, changes the bytes
// before they are sent.
func (s *Server) framesOf(recs []*geologv1.StoredRecord) []byte {
	var out []byte
	for len(recs) > 0 {
		n := 1
		for n < len(recs) && recs[n].GetOffset() == recs[0].GetOffset()+uint64(n) &&
			recs[n].GetEpoch() == recs[0].GetEpoch() && recs[n].GetAppendTimeUnixNanos() == recs[0].GetAppendTimeUnixNanos() {
			n++
		}
		h := batch.Header{Type: batch.TypeData, BaseOffset: recs[0].GetOffset(), Epoch: recs[0].GetEpoch(), AppendTimeUnixNanos: recs[0].GetAppendTimeUnixNanos()}
		rs := make([]batch.Record, n)
		for i, r := range recs[:n] {
			rs[i] = batch.Record{Key: r.GetKey(), Value: r.GetValue(), ProducerTimeUnixNanos: r.GetProducerTimeUnixNanos(), Tombstone: r.GetTombstone()}
			for _, hd := range r.GetHeaders() {
				rs[i].Headers = append(rs[i].Headers, batch.RecordHeader{Key: hd.GetKey(), Value: hd.GetValue()})
			}
		}
		out = batch.Encode(out, h, rs)
		recs = recs[n:]
	}
	if s.cfg.DamageFrames != nil {
		out = s.cfg.DamageFrames(out)
	}
	return out
}

// wantsFrames reports whether a read asking for the frame form gets it.
func (s *Server) wantsFrames(want bool, key []byte) bool {
	return want && key == nil && s.cfg.ServeFrames
}
