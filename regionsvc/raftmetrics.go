package regionsvc

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// The node's Raft transport, observed at collection from its counters
// (raftnet.Stats; nothing is counted here on the send path):
//
//	geolog.raft.sent_messages, .sent_batches  handed to the network (a batch
//	                                          is one gRPC write to one peer)
//	geolog.raft.dropped_messages{reason}      never reached the network:
//	                                          queue_full (a peer's queue was at
//	                                          its bound: the peer reads slower
//	                                          than this node sends, Raft
//	                                          retransmits), unreachable,
//	                                          stream_broken, invalid
//	geolog.raft.send_queue_messages, _bytes   what waits in the peers' queues
//
// A Raft send never waits for a peer (raftnet's contract): a slow or stuck
// peer costs its queue's bound in memory and shows here as drops.
type raftTransportInstruments struct {
	sent, batches, dropped metric.Int64ObservableCounter
	queued, queuedBytes    metric.Int64ObservableGauge
}

var (
	raftDropQueueFull    = metric.WithAttributes(attribute.String("reason", "queue_full"))
	raftDropUnreachable  = metric.WithAttributes(attribute.String("reason", "unreachable"))
	raftDropStreamBroken = metric.WithAttributes(attribute.String("reason", "stream_broken"))
	raftDropInvalid      = metric.WithAttributes(attribute.String("reason", "invalid"))
)

// registerRaftTransportMetrics adds the instruments above to the node's
// meter.
func registerRaftTransportMetrics(n *Node, m metric.Meter) error {
	var ins raftTransportInstruments
	var err error
	if ins.sent, err = m.Int64ObservableCounter("geolog.raft.sent_messages",
		metric.WithDescription("Raft messages this node handed to the network for its peers"), metric.WithUnit("{message}")); err != nil {
		return err
	}
	if ins.batches, err = m.Int64ObservableCounter("geolog.raft.sent_batches",
		metric.WithDescription("batches of Raft messages sent to peers: one gRPC write to one peer each"), metric.WithUnit("{batch}")); err != nil {
		return err
	}
	if ins.dropped, err = m.Int64ObservableCounter("geolog.raft.dropped_messages",
		metric.WithDescription("Raft messages for peers that never reached the network, by reason: queue_full (the peer's send queue was at its bound), unreachable, stream_broken, invalid; Raft retransmits"),
		metric.WithUnit("{message}")); err != nil {
		return err
	}
	if ins.queued, err = m.Int64ObservableGauge("geolog.raft.send_queue_messages",
		metric.WithDescription("Raft messages waiting in this node's per-peer send queues"), metric.WithUnit("{message}")); err != nil {
		return err
	}
	if ins.queuedBytes, err = m.Int64ObservableGauge("geolog.raft.send_queue_bytes",
		metric.WithDescription("encoded bytes of the Raft messages waiting in this node's per-peer send queues"), metric.WithUnit("By")); err != nil {
		return err
	}
	_, err = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		n.observeRaftTransport(o, &ins)
		return nil
	}, ins.sent, ins.batches, ins.dropped, ins.queued, ins.queuedBytes)
	return err
}

func (n *Node) observeRaftTransport(o metric.Observer, ins *raftTransportInstruments) {
	// The region and its transport are set up before the node serves
	// (metrics_ops.go reads them the same way); a region of one has none.
	if !n.serving.Load() || n.region == nil || n.region.transport == nil {
		return
	}
	s := n.region.transport.Stats()
	o.ObserveInt64(ins.sent, int64(s.MessagesSent))
	o.ObserveInt64(ins.batches, int64(s.BatchesSent))
	o.ObserveInt64(ins.dropped, int64(s.DroppedQueueFull), raftDropQueueFull)
	o.ObserveInt64(ins.dropped, int64(s.DroppedReserveFull), metric.WithAttributes(attribute.String("reason", "reserve_full")))
	o.ObserveInt64(ins.dropped, int64(s.DroppedUnreachable), raftDropUnreachable)
	o.ObserveInt64(ins.dropped, int64(s.DroppedStreamBroken), raftDropStreamBroken)
	o.ObserveInt64(ins.dropped, int64(s.DroppedInvalid), raftDropInvalid)
	o.ObserveInt64(ins.queued, int64(s.QueuedMessages))
	o.ObserveInt64(ins.queuedBytes, int64(s.QueuedBytes))
}
