// Package client is the Go SDK for geolog: admin calls, an idempotent,
// pipelined producer, and consumers that read or follow one range, or one
// key of it (ReadOptions.ByKey, SubscribeKey: a conversation's sync).
//
//	c, err := client.New("127.0.0.1:7401,127.0.0.1:7402,127.0.0.1:7403")
//	p, err := c.NewProducer("chat")
//	p.Produce(ctx, &client.Record{Key: k, Value: v}, func(r client.ProduceResult, err error) { ... })
//	err = p.Flush(ctx)
//	for rec, err := range c.Subscribe(ctx, "chat", 0, client.StartAt{Offset: 0}) { ... }
//
// # End-to-end encryption
//
// SealWith (a ProducerOpt) seals record values, and the headers it names,
// under keys the application supplies per conversation (package
// client/e2e); OpenWith (a ConsumerOpt for Read and Subscribe) opens them,
// failing or, with SkipUnopenable, skipping and reporting records that do
// not open. Servers see ciphertext only. docs/e2e-encryption.md has the
// format.
//
// # Errors
//
// Every error that came from the server is an *Error (an alias of
// apierr.Error) whose Code and Retriable say what happened and whether the
// same request may succeed later. IsRetriable and CodeOf classify any error
// this package returns. The client retries retriable errors itself where that
// is safe (reads, metadata, idempotent appends), so an error a caller sees is
// usually final; the exceptions are documented where they occur. A server
// that refuses a request for its load or a quota (OVERLOADED) says how long
// to wait (RetryAfter); the client then waits at least that long before the
// request is sent again, whatever its own backoff.
//
// # Routing
//
// A Client knows a ring of node addresses: the bootstrap addresses given to
// New (a comma-separated list) and Addrs, then those it learns from leader
// hints, at most AddrsMax in all, with one connection each, made on first
// use and closed by Close. An address that failed to serve a request is
// avoided for a backoff (growing while it keeps failing, reset when it
// answers) as long as another one is up.
//
//   - Admin calls and reads go to any node: the current address while it is
//     up, else the next one up. After a retriable error the call moves to
//     the error's leader hint, or else to the next address, and is retried
//     after the usual backoff (RetriesMax, RetryBackoff). CreateStream is
//     retried too: the server answers a repeated create of the same
//     stream with the stream.
//   - Subscribe resumes after a retriable error or a broken stream at the
//     next address, from the last delivered offset (offsets are the same
//     on every replica), checking that that record has the epoch it was
//     delivered with: a failover may have replaced a divergent tail it
//     delivered, which ends the subscription with a ForkError (fork.go).
//     A node whose tail is behind that offset (CodeOffsetPastLocalTail) is
//     skipped like a failed one, once the home confirms the record.
//   - Each range of a producer sends to one address: the range's leader as
//     far as the client knows. The Client caches the leader of every
//     (stream, range) it saw acknowledge an append or named by a hint, so
//     new producers start there; a range without one starts at any address.
//     Only the leader appends; steps 4 and 5 below say how a range moves.
//
// # Producer contract
//
// A Producer routes each record to a range (keyspace.RangeForKey of its key;
// keyless records go to a sticky range that changes once it took 16 KiB of
// them, as Kafka's uniform sticky partitioner does), and
// each range is driven by one goroutine that owns that range's state:
//
//  1. Records wait in the range's buffer until the in-flight window has room
//     (and, with a linger, until the linger passes or a batch fills). Batches
//     form while they wait. Produce admits a record only while the producer
//     holds fewer unsent bytes than its queueing-delay bound (delaybudget.go:
//     what the stream acknowledged over the last QueueDelayTarget plus the
//     network's round trip to the leader) and
//     fewer bytes in all than BufferedBytesMax;
//     past either Produce blocks, or fails the record with ErrBufferFull
//     under FailWhenFull.
//  2. A batch gets the producer id and the next sequence numbers of its range
//     when it is cut; a (producer id, sequence) pair is bound to one record
//     for ever, so resending it can never append a different record.
//  3. Batches are pipelined over one AppendStream per range, to the range's
//     address (see Routing), at most InflightBatchesMax unacknowledged at a
//     time; the server answers a range's requests in order. Under a producer id the server has not yet
//     acknowledged a batch of, a range sends one batch at a time: a server
//     may take any first sequence from an unknown id, and a second batch
//     landing before a retried first one would reorder and lose records.
//  4. On a retriable error or a broken stream the range rewinds: it
//     abandons the stream and, after a bounded, jittered backoff, opens a
//     new one at its address (step 5) and resends every unacknowledged batch
//     in sequence order with the same producer id and sequence numbers. The
//     server's dedup is rebuilt from the replicated log, so whichever node
//     leads the range returns the original offsets for batches it already
//     has: nothing is reordered or duplicated, on one node or across moves.
//  5. A range's address changes only when it rewinds. An error with a
//     leader hint (NOT_LEADER from a follower) moves it to the hinted
//     address, learned and cached, without the backoff for the first three
//     hints after an acknowledgement. NOT_LEADER without a hint moves it to
//     the leader another producer of the client learned since, else to the
//     next address of the ring; if it says the leader is cut off from its
//     quorum (LeaderCutOff), the move is at once, no hint leads back to
//     that node for the attempt timeout, and while the others elect (they
//     answer NOT_LEADER, a mirror region's nodes NOT_HOME) the range asks
//     them at the shortest backoff. A NOT_HOME whose hint names that node
//     (the mirror heard of no newer leader yet) moves on as NOT_LEADER
//     without a hint does. LEASE_EXPIRED (a home that could not renew
//     its lease, perhaps taken over by another region) moves it back to the
//     next bootstrap address, whose node redirects it; that node too is
//     given up on for the attempt timeout (as a cut-off leader is), so a
//     mirror's NOT_HOME naming it does not lead back there, and the
//     client's own nodes are asked at the shortest backoff until the
//     takeover (the first such move is at once, later ones, as when every
//     node of the client's region answers LEASE_EXPIRED, wait the
//     backoff). PRODUCER_STATE_LOST on a producer id the range had
//     acknowledged (a takeover's fork cut its batches off) resends under a
//     fresh id at once (step 6). A stream that failed before its node
//     answered anything (the node is down) or SHUTTING_DOWN marks the
//     address failed and moves on the same way. Any other retriable failure
//     (a working stream broke, an overloaded leader) keeps the address; if
//     its node died, the next attempt fails before any answer and moves on.
//     A stream that answers nothing for AppendAttemptTimeout while batches
//     are in flight on it (a paused leader, one cut off from its
//     followers) rewinds at once, marks the address failed and moves on
//     the same way; for that timeout a hint naming that address is taken
//     as no hint (attempt.go).
//  6. On a final error for the oldest unacknowledged batch, that batch's
//     records fail. The server still expects that batch's base sequence, so
//     the batches behind it cannot have been appended; they move to a fresh
//     producer id for the range (sequences restart at 0) and are resent.
//     PRODUCER_STATE_LOST (the range no longer knows the producer as it
//     knows itself: its state expired, or a failover cut acknowledged
//     batches off the log) fails nothing: every unacknowledged batch moves
//     to a fresh id and is resent. SEQUENCE_GAP (the server disagrees
//     within one epoch) fails every batch in flight.
//  7. When a record's deadline (its context's deadline or the delivery
//     timeout) passes while it is in flight, its batch and every batch in
//     flight with it fail, because their outcome is unknown, and the range
//     continues under a fresh producer id.
//  8. Callbacks of one range run in offset order on that range's goroutine;
//     they must not block, nor call Close.
package client
