// Package wan emulates WAN links between regions of a cluster that runs on
// one machine, on loopback, without tc/netem or containers: a Link is a TCP
// proxy from a listen address to an upstream address that delays each
// direction (latency plus bounded jitter), can cap its bandwidth, and can be
// cut and healed at run time. A Net holds many named links ("us-east->
// eu-west.n1", "eu-west->pg") and breaks them by region (CutRegion,
// Partition). Server and NewControlHandler put a Net behind an HTTP control
// API; cmd/geolog-wan is the thin binary for real-process clusters, chaos
// scripts and curl.
//
// # Why not toxiproxy
//
// github.com/Shopify/toxiproxy/v2 v2.5.0 was evaluated first, in-process,
// with the harness of bench_test.go (proxy in a child process, its CPU from
// getrusage; 2-core VM):
//
//   - Latency accuracy is as good as ours: 40 ms each way gives a 64-byte
//     round trip of 80.85 ms at p50 for both, 81.1–81.2 ms next to a
//     50 MB/s stream on the same link. Its latency toxic works chunk by
//     chunk in one goroutine, so bytes keep their order.
//   - CPU: at 80 MB/s offered through a 40 ms link it takes 9.7 % of a core
//     (1.22 CPU-s/GB) against 4.4 % (0.56 CPU-s/GB) here; at full speed
//     0.72 against 0.50 CPU-s/GB. Every 32 KiB chunk is allocated and
//     crosses three goroutines per direction.
//   - Partitions: its black hole (the timeout toxic with timeout 0)
//     discards bytes. The sender is never held back (256 MiB written into
//     it without blocking) and removing the toxic resets the connection:
//     what was sent during the cut is lost, which no real partition does
//     to a TCP stream, and which would hide exactly the bugs a partition
//     test looks for (a stalled stream that must recover, or time out).
//     Disabling a proxy closes its listener and connections: a reset only.
//   - Jitter comes from the global math/rand (not seeded); logs go through
//     zerolog; the bandwidth toxic is per connection, not per link; the
//     buffer per toxic is 1024 chunks per connection (up to 32 MiB).
//
// So the package is its own proxy, in the repository's shape: a
// deterministic core (delayQueue and shaper: no goroutines, no clock, no
// sockets; tested with datadriven scripts and against a model) and a
// driver that owns the sockets. Its one limit that toxiproxy lacks is on
// purpose: a connection holds at most BufferBytesMax per direction, which
// caps one connection at about BufferBytesMax / latency (8 MiB / 40 ms ≈
// 200 MB/s, measured 198 MB/s; a real 40 ms path with Linux's default 6 MiB
// window gives a single TCP connection less).
//
// # Driver contract
//
//  1. Delay. Each read from a socket (at most 64 KiB) is due at the far
//     end at read time + the bandwidth queue (rule 8) + Latency + a uniform
//     draw in [0, Jitter], clamped to no earlier than the previous read of
//     the same direction: bytes never overtake, so under sustained traffic
//     the delay tends to Latency + Jitter and jitter shows on sparse
//     traffic, as queueing does. Bytes are never delivered early; reads due
//     within 1 ms of each other share one release (late by < 1 ms), and the
//     Go timer adds its slack (measured ≈ 0.3–0.9 ms at 40 ms).
//  2. Order and content. Each direction of a connection delivers exactly
//     the bytes read, in order, with writev of everything due at once. The
//     end of a stream travels behind its bytes: an EOF half-closes the far
//     side (CloseWrite) one latency later; a read error (the peer reset)
//     resets both sides then. A write error resets both sides at once. A
//     connection closes when both directions have delivered their EOF.
//  3. Bounds. Per direction of a connection at most BufferBytesMax (plus
//     one 64 KiB block) is held; a full buffer stops reading, so TCP flow
//     control pushes back on the sender. An idle connection holds two
//     blocks (128 KiB); blocks are pooled. At most ConnsMax connections per
//     link; more are reset on accept. Release marks are bounded by
//     (latency + jitter) / 1 ms per direction. Accept errors back off up to
//     1 s; dials are bounded by DialTimeout.
//  4. Cut(CutBlackhole) is a partition. Nothing more is read from, or
//     written to, either socket of any connection; what the proxy already
//     read is held (at most one read per direction arrives after the cut).
//     Senders can write until their socket buffers and the proxy's fill
//     (≈ 4 MB on loopback), then block, as on a real path. No FIN or RST is
//     sent; an application's own timeouts and keepalives must notice. New
//     connections complete the TCP handshake (the kernel answers for the
//     proxy, unavoidable in user space) but are neither read nor dialled
//     upstream: they hang.
//  5. Heal resumes: held connections deliver what they held first (it is
//     overdue, so at once) and carry on; held new connections are dialled
//     now. This is a partition that ends before TCP gives up: the stream
//     arrives complete. An application that gave up in between closed its
//     socket, and the other side learns it after heal (its writes fail, or
//     it reads the FIN). To drop the connections of a partition instead,
//     Cut(CutReset) before Heal.
//  6. Cut(CutReset) resets every connection of the link at once (RST both
//     ways; held bytes are dropped) and resets new connections as soon as
//     they are accepted: clients see the connect succeed and the first read
//     or write fail (a closed listener would refuse the connect, but
//     re-binding the port on Heal could race another process for it).
//     Cutting a cut link changes its mode; from blackhole to reset it
//     resets the held connections.
//  7. SetLatency and SetBandwidth apply to bytes read afterwards, on live
//     connections too; rule 1's clamp keeps order when the latency drops.
//  8. Bandwidth. A cap is a virtual transmitter per direction shared by all
//     of the link's connections: a read of n bytes departs when the
//     transmitter has sent the earlier ones plus n / rate, then takes the
//     latency. BufferBytesMax is the bottleneck's queue.
//  9. Determinism. Each direction of each connection draws jitter from
//     its own generator seeded with (Seed, connection number, direction).
//     Read boundaries are the kernel's, so a run's exact timings are not
//     reproducible; the core given the same reads and clock is.
//  10. Goroutines. One accept loop per link; per connection a reader and a
//     writer per direction. Close stops listening, resets every connection
//     and waits for all of them. Logs go through Config.Logger (named
//     "wan", with the link's name); cuts, heals and setting changes log at
//     info.
//
// Not emulated: packet loss and retransmission, reordering, the TCP
// handshake's round trip (a connect returns at once; the first request then
// costs 2 × latency, not 3 ×; TLS handshakes do pay their round trips),
// asymmetric latency, one-way cuts.
//
// # Control API
//
// See NewControlHandler; e.g. with geolog-wan on 127.0.0.1:7600:
//
//	curl 127.0.0.1:7600/links
//	curl -X POST '127.0.0.1:7600/links/us-east->eu-west.n1/cut?mode=blackhole'
//	curl -X POST '127.0.0.1:7600/links/us-east->eu-west.n1/latency?ms=120&jitter_ms=10'
//	curl -X POST '127.0.0.1:7600/regions/eu-west/cut?mode=reset'
//	curl -X POST '127.0.0.1:7600/partition?a=us-east&b=eu-west'
//	curl -X POST '127.0.0.1:7600/heal'
package wan
