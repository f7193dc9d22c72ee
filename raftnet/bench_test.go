package raftnet

import (
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc"
)

// countingHandler counts what it receives and keeps nothing.
type countingHandler struct {
	msgs atomic.Int64
}

func (h *countingHandler) HandleMessages(_ NodeID, msgs []GroupMessage) int {
	h.msgs.Add(int64(len(msgs)))
	return 0
}
func (h *countingHandler) HandleSnapshot(NodeID, GroupID, *raftpb.Message, io.Reader) error {
	return nil
}
func (h *countingHandler) ReportUnreachable(NodeID, []GroupID)   {}
func (h *countingHandler) ReportSnapshot(NodeID, GroupID, error) {}

// BenchmarkLoopbackPair measures one direction of a loopback pair: messages
// of 1,000 groups from node 1 to node 2, as fast as the queue admits them
// (a full queue is retried, not dropped, to measure throughput).
func BenchmarkLoopbackPair(b *testing.B) {
	for _, bc := range []struct {
		name       string
		entryBytes int
	}{
		{"heartbeat", -1},
		{"app-256B", 256},
		{"app-4KiB", 4096},
	} {
		b.Run(bc.name, func(b *testing.B) {
			recv := &countingHandler{}
			rx, err := NewGRPCTransport(Config{NodeID: 2, Handler: recv})
			if err != nil {
				b.Fatal(err)
			}
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			srv := grpc.NewServer(rx.ServerOptions()...)
			rx.Register(srv)
			go func() { _ = srv.Serve(lis) }()
			defer srv.Stop()
			defer rx.Close()
			tx, err := NewGRPCTransport(Config{NodeID: 1, Handler: &countingHandler{}})
			if err != nil {
				b.Fatal(err)
			}
			defer tx.Close()
			if err := tx.SetPeer(2, lis.Addr().String()); err != nil {
				b.Fatal(err)
			}
			m := msg(raftpb.MsgHeartbeat, 1, 2, 0)
			if bc.entryBytes >= 0 {
				m = appMsg(1, 2, 0, bc.entryBytes)
			}
			// Warm up: the stream is open before the clock starts.
			for recv.msgs.Load() == 0 {
				_ = tx.Send(1, m)
				time.Sleep(time.Millisecond)
			}
			base := recv.msgs.Load()
			before := tx.Stats()
			b.ResetTimer()
			start := time.Now()
			for i := 0; i < b.N; i++ {
				for {
					err := tx.Send(GroupID(i%1000+1), m)
					if err == nil {
						break
					}
					if !errors.Is(err, ErrQueueFull) {
						b.Fatal(err)
					}
					runtime.Gosched()
				}
			}
			for recv.msgs.Load() < base+int64(b.N) {
				time.Sleep(50 * time.Microsecond)
			}
			elapsed := time.Since(start).Seconds()
			b.StopTimer()
			after := tx.Stats()
			batches := after.BatchesSent - before.BatchesSent
			bytes := after.BytesSent - before.BytesSent
			b.ReportMetric(float64(b.N)/elapsed, "msgs/s")
			b.ReportMetric(float64(batches)/elapsed, "batches/s")
			b.ReportMetric(float64(b.N)/float64(max(batches, 1)), "msgs/batch")
			b.ReportMetric(float64(bytes)/elapsed/(1<<20), "MiB/s")
		})
	}
}

// BenchmarkMemDeliver measures the simulator's network: one round of 100
// messages between two nodes.
func BenchmarkMemDeliver(b *testing.B) {
	n := NewMemNetwork(MemConfig{})
	h := &countingHandler{}
	tx, _ := n.AddNode(1, h)
	if _, err := n.AddNode(2, h); err != nil {
		b.Fatal(err)
	}
	m := msg(raftpb.MsgHeartbeat, 1, 2, 0)
	rng := newBenchRand()
	b.ResetTimer()
	for range b.N {
		for g := range 100 {
			if err := tx.Send(GroupID(g+1), m); err != nil {
				b.Fatal(err)
			}
		}
		n.Deliver(rng)
	}
	b.ReportMetric(float64(b.N*100)/b.Elapsed().Seconds(), "msgs/s")
}

func newBenchRand() *rand.Rand { return rand.New(rand.NewPCG(1, 2)) }

// echoHandler answers every MsgApp with a MsgAppResp through its transport,
// and signals every MsgAppResp it gets.
type echoHandler struct {
	countingHandler
	tr   *GRPCTransport
	self NodeID
	got  chan struct{}
}

func (h *echoHandler) HandleMessages(from NodeID, msgs []GroupMessage) int {
	for _, gm := range msgs {
		switch gm.Message.GetType() {
		case raftpb.MsgApp:
			_ = h.tr.Send(gm.Group, msg(raftpb.MsgAppResp, h.self, from, gm.Message.GetIndex()))
		case raftpb.MsgAppResp:
			h.got <- struct{}{}
		}
	}
	return 0
}

// BenchmarkLoopbackRoundTrip measures the unloaded latency a Raft round trip
// pays in the transport: one MsgApp out, one MsgAppResp back, nothing else
// in flight (no batching to hide behind).
func BenchmarkLoopbackRoundTrip(b *testing.B) {
	ha := &echoHandler{self: 1, got: make(chan struct{}, 1)}
	hb := &echoHandler{self: 2, got: make(chan struct{}, 1)}
	var addrs [2]string
	for i, h := range []*echoHandler{ha, hb} {
		tr, err := NewGRPCTransport(Config{NodeID: h.self, Handler: h})
		if err != nil {
			b.Fatal(err)
		}
		h.tr = tr
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		srv := grpc.NewServer(tr.ServerOptions()...)
		tr.Register(srv)
		go func() { _ = srv.Serve(lis) }()
		defer srv.Stop()
		defer tr.Close()
		addrs[i] = lis.Addr().String()
	}
	if err := ha.tr.SetPeer(2, addrs[1]); err != nil {
		b.Fatal(err)
	}
	if err := hb.tr.SetPeer(1, addrs[0]); err != nil {
		b.Fatal(err)
	}
	m := appMsg(1, 2, 1, 256)
	roundTrip := func() {
		for ha.tr.Send(1, m) != nil {
			time.Sleep(time.Millisecond) // only while the first stream opens
		}
		<-ha.got
	}
	roundTrip()
	b.ResetTimer()
	for range b.N {
		roundTrip()
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "µs/roundtrip")
}
