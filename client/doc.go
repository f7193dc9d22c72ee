// Package client is the Go SDK for geolog: admin calls, an idempotent,
// pipelined producer, and consumers that read or follow one range.
//
//	c, err := client.New("127.0.0.1:7400")
//	p, err := c.NewProducer("chat")
//	p.Produce(ctx, &client.Record{Key: k, Value: v}, func(r client.ProduceResult, err error) { ... })
//	err = p.Flush(ctx)
//	for rec, err := range c.Subscribe(ctx, "chat", 0, client.StartAt{Offset: 0}) { ... }
//
// # Errors
//
// Every error that came from the server is an *Error (an alias of
// apierr.Error) whose Code and Retriable say what happened and whether the
// same request may succeed later. IsRetriable and CodeOf classify any error
// this package returns. The client retries retriable errors itself where that
// is safe (reads, metadata, idempotent appends), so an error a caller sees is
// usually final; the exceptions are documented where they occur.
//
// # Producer contract
//
// A Producer routes each record to a range (keyspace.RangeForKey of its key;
// keyless records go to a sticky range that changes after every batch), and
// each range is driven by one goroutine that owns that range's state:
//
//  1. Records wait in the range's buffer until the in-flight window has room
//     (and, with a linger, until the linger passes or a batch fills). Batches
//     form while they wait.
//  2. A batch gets the producer id and the next sequence numbers of its range
//     when it is cut; a (producer id, sequence) pair is bound to one record
//     for ever, so resending it can never append a different record.
//  3. Batches are pipelined over one AppendStream per range, at most
//     InflightBatchesMax unacknowledged at a time; the server answers a
//     range's requests in order. Under a producer id the server has not yet
//     acknowledged a batch of, a range sends one batch at a time: a server
//     may take any first sequence from an unknown id, and a second batch
//     landing before a retried first one would reorder and lose records.
//  4. On a retriable error or a broken stream the range rewinds: after a
//     bounded, jittered backoff it opens a new stream and resends every
//     unacknowledged batch in sequence order with the same sequence numbers.
//     The server's dedup returns the original offsets for batches it already
//     had, so nothing is reordered or duplicated.
//  5. On a final error for the oldest unacknowledged batch, that batch's
//     records fail. The server still expects that batch's base sequence, so
//     the batches behind it cannot have been appended; they move to a fresh
//     producer id for the range (sequences restart at 0) and are resent.
//  6. When a record's deadline (its context's deadline or the delivery
//     timeout) passes while it is in flight, its batch and every batch in
//     flight with it fail, because their outcome is unknown, and the range
//     continues under a fresh producer id.
//  7. Callbacks of one range run in offset order on that range's goroutine;
//     they must not block, nor call Close.
package client
