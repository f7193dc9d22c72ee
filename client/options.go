package client

import (
	"context"
	"crypto/tls"
	"fmt"
	"time"

	"github.com/hashicorp/go-hclog"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"

	"github.com/geolog/geolog/client/e2e"
)

// Opt configures a Client. Options are validated together in New.
type Opt func(*clientConfig)

type clientConfig struct {
	tls               *tls.Config
	logger            hclog.Logger
	messageBytesMax   int
	streamWindowBytes int32
	connWindowBytes   int32
	keepaliveTime     time.Duration
	keepaliveTimeout  time.Duration
	requestTimeout    time.Duration
	callTimeout       time.Duration
	retriesMax        int
	backoffMin        time.Duration
	backoffMax        time.Duration
	dialOpts          []grpc.DialOption
	addrs             []string
	tracerProvider    trace.TracerProvider
	token             func(ctx context.Context) (string, error) // BearerToken, TokenSource
	readRecordsForm   bool                                      // ReadRecordsForm
}

func defaultClientConfig() clientConfig {
	return clientConfig{
		logger:            hclog.NewNullLogger(),
		messageBytesMax:   64 << 20,
		streamWindowBytes: 4 << 20,
		connWindowBytes:   16 << 20,
		keepaliveTime:     30 * time.Second,
		keepaliveTimeout:  10 * time.Second,
		requestTimeout:    30 * time.Second,
		retriesMax:        10,
		backoffMin:        100 * time.Millisecond,
		backoffMax:        2 * time.Second,
	}
}

// Addrs adds bootstrap node addresses ("host:port", or comma-separated
// lists of them) to New's addr; there are none by default. New's addr may
// then be empty. Together they may name at most AddrsMax addresses;
// duplicates count once.
func Addrs(addrs ...string) Opt {
	return func(c *clientConfig) { c.addrs = append(c.addrs, addrs...) }
}

// TLSConfig makes the client dial with TLS using cfg (set Certificates for
// mutual TLS), overriding the default of an insecure (plaintext) connection.
func TLSConfig(cfg *tls.Config) Opt { return func(c *clientConfig) { c.tls = cfg } }

// Logger sets the logger, overriding the default of hclog.NewNullLogger().
func Logger(l hclog.Logger) Opt { return func(c *clientConfig) { c.logger = l } }

// MessageBytesMax bounds gRPC messages in both directions, overriding the
// default of 64 MiB. It must be at least 1 MiB.
func MessageBytesMax(n int) Opt { return func(c *clientConfig) { c.messageBytesMax = n } }

// WindowBytes sets the HTTP/2 initial flow-control windows of each stream
// and of the connection, overriding the defaults of 4 MiB and 16 MiB, so big
// batches stream without waiting for window updates. Each must be at least
// 64 KiB and conn at least stream.
func WindowBytes(stream, conn int32) Opt {
	return func(c *clientConfig) { c.streamWindowBytes, c.connWindowBytes = stream, conn }
}

// Keepalive sets how long a connection may be idle before the client pings
// the server and how long it then waits for the ack, overriding the defaults
// of 30s and 10s. time must be at least 10s (gRPC's floor). The server must
// permit pings this often (keepalive.EnforcementPolicy.MinTime).
func Keepalive(time, timeout time.Duration) Opt {
	return func(c *clientConfig) { c.keepaliveTime, c.keepaliveTimeout = time, timeout }
}

// RequestTimeout bounds each attempt of a unary call whose context has no
// deadline, overriding the default of 30s. Zero disables it.
func RequestTimeout(d time.Duration) Opt { return func(c *clientConfig) { c.requestTimeout = d } }

// CallTimeout bounds each unary call as a whole (or its context's deadline,
// if that is sooner), its retries and their backoff included (RequestTimeout bounds one
// attempt); zero, the default, leaves the call bounded only by its
// attempts. Like Kafka's default.api.timeout.ms.
func CallTimeout(d time.Duration) Opt { return func(c *clientConfig) { c.callTimeout = d } }

// RetriesMax bounds the retries of a retriable read, describe, list or
// create call (each may go to another node), and the consecutive failed
// reconnects of a subscription
// that has delivered nothing in between, overriding the default of 10.
func RetriesMax(n int) Opt { return func(c *clientConfig) { c.retriesMax = n } }

// RetryBackoff sets the bounds of the jittered exponential backoff between
// retries, overriding the defaults of 100ms and 2s. It is also the default
// for producers (see ProducerRetryBackoff), bounds how long an address that
// failed is avoided while others are up, and bounds gRPC's backoff between
// attempts to re-establish a broken connection.
func RetryBackoff(min, max time.Duration) Opt {
	return func(c *clientConfig) { c.backoffMin, c.backoffMax = min, max }
}

// DialOptions appends raw gRPC dial options (interceptors, for example)
// after the client's own; there are none by default.
func DialOptions(opts ...grpc.DialOption) Opt {
	return func(c *clientConfig) { c.dialOpts = append(c.dialOpts, opts...) }
}

// TracerProvider makes the client trace its calls through tp: one client
// span per gRPC call (OpenTelemetry's otelgrpc), with the W3C trace
// context (traceparent) sent to the node, whose spans then continue the
// caller's trace. The default is no tracing, at no cost.
func TracerProvider(tp trace.TracerProvider) Opt {
	return func(c *clientConfig) { c.tracerProvider = tp }
}

// ReadRecordsForm makes Read, Subscribe and group consumers ask for the
// records form of reads (one protobuf message per record), as clients did
// before the frame form, instead of the default frame form (the records
// as the log stores them, checked by their CRC; docs/api.md "The frame
// form"). Either way a reply is read in the form the node answers.
func ReadRecordsForm() Opt { return func(c *clientConfig) { c.readRecordsForm = true } }

func (c *clientConfig) validate() error {
	if c.token != nil && c.tls == nil {
		return fmt.Errorf("client: a bearer token is sent over TLS only: give TLSConfig")
	}
	switch {
	case c.logger == nil:
		return fmt.Errorf("client: Logger is nil")
	case c.messageBytesMax < 1<<20:
		return fmt.Errorf("client: MessageBytesMax %d is below 1 MiB", c.messageBytesMax)
	case c.streamWindowBytes < 64<<10 || c.connWindowBytes < c.streamWindowBytes:
		return fmt.Errorf("client: WindowBytes(%d, %d): stream must be >= 64 KiB and conn >= stream", c.streamWindowBytes, c.connWindowBytes)
	case c.keepaliveTime < 10*time.Second || c.keepaliveTimeout <= 0:
		return fmt.Errorf("client: Keepalive(%v, %v): time must be >= 10s and timeout positive", c.keepaliveTime, c.keepaliveTimeout)
	case c.requestTimeout < 0:
		return fmt.Errorf("client: RequestTimeout %v is negative", c.requestTimeout)
	case c.callTimeout < 0:
		return fmt.Errorf("client: CallTimeout %v is negative", c.callTimeout)
	case c.retriesMax < 0:
		return fmt.Errorf("client: RetriesMax %d is negative", c.retriesMax)
	case c.backoffMin <= 0 || c.backoffMax < c.backoffMin:
		return fmt.Errorf("client: RetryBackoff(%v, %v): min must be positive and max >= min", c.backoffMin, c.backoffMax)
	}
	return nil
}

// ProducerOpt configures a Producer. Options are validated together in
// NewProducer.
type ProducerOpt func(*producerConfig)

// InflightBatchesMaxLimit is the largest allowed InflightBatchesMax: the
// server keeps the last 16 batches of each producer for dedup, so a longer
// window could make a resent batch too old to deduplicate.
const InflightBatchesMaxLimit = 16

type producerConfig struct {
	linger             time.Duration
	batchBytesMax      int
	inflightBatchesMax int
	bufferedBytesMax   int64
	deliveryTimeout    time.Duration
	queueDelayTarget   time.Duration
	failWhenFull       bool
	attemptTimeout     time.Duration
	idempotent         bool
	backoffMin         time.Duration
	backoffMax         time.Duration
	producerID         uint64
	// SealWith: seal is set by the option, sealKeys may still be nil
	// (refused by validate).
	seal        bool
	sealKeys    e2e.KeyProvider
	sealHeaders []string
	// timing: WithTiming.
	timing bool
	// recordsForm: WithRecordsForm.
	recordsForm bool
}

func defaultProducerConfig(c *clientConfig) producerConfig {
	return producerConfig{
		batchBytesMax:      1 << 20,
		inflightBatchesMax: 1,
		bufferedBytesMax:   64 << 20,
		deliveryTimeout:    2 * time.Minute,
		queueDelayTarget:   QueueDelayTargetDefault,
		attemptTimeout:     AppendAttemptTimeoutDefault,
		idempotent:         true,
		backoffMin:         c.backoffMin,
		backoffMax:         c.backoffMax,
	}
}

// Linger makes a range wait up to d after its oldest buffered record for a
// batch to fill before sending it, overriding the default of 0: send as soon
// as the in-flight window has room, while batches form behind a full window.
// Flush ignores the linger.
func Linger(d time.Duration) ProducerOpt { return func(c *producerConfig) { c.linger = d } }

// BatchBytesMax bounds a batch's record bytes, overriding the default of
// 1 MiB. A record larger than this fails with CodeRecordTooLarge.
func BatchBytesMax(n int) ProducerOpt { return func(c *producerConfig) { c.batchBytesMax = n } }

// InflightBatchesMax bounds the unacknowledged batches per range, overriding
// the default of 1; at most InflightBatchesMaxLimit (16).
//
// The default is 1 because records batch behind the batch in flight: a
// producer spreading records over many ranges with a wider window sends
// mostly one-record batches, and the per-batch cost (request, write, fsync
// share) then dominates. Measured on 2 cores, 8 producers over 8 ranges at
// 75k records/s: p99 7.4 ms with 1, 10.9 ms with 2, 19.5 ms with 5, while
// full-speed throughput stayed within 6%. A wider window helps a producer
// writing to few ranges over a long round trip.
func InflightBatchesMax(n int) ProducerOpt {
	return func(c *producerConfig) { c.inflightBatchesMax = n }
}

// BufferedBytesMax bounds the bytes of records produced but not yet
// acknowledged or failed, across all ranges; Produce blocks while the bound
// is reached (or fails, with FailWhenFull). It overrides the default of 64
// MiB and must be at least BatchBytesMax. QueueDelayTarget usually binds
// first: this is the bound on memory, that one on time.
func BufferedBytesMax(n int64) ProducerOpt { return func(c *producerConfig) { c.bufferedBytesMax = n } }

// DeliveryTimeout bounds the time from Produce to a record's callback,
// retries included, overriding the default of 2 minutes. Zero means records
// are bounded only by their contexts.
func DeliveryTimeout(d time.Duration) ProducerOpt {
	return func(c *producerConfig) { c.deliveryTimeout = d }
}

// QueueDelayTarget bounds how long records wait in the producer before
// they are sent at full speed, overriding the default of
// QueueDelayTargetDefault (50 ms); 0 turns it off, leaving only
// BufferedBytesMax. The producer holds its unsent records (produced and
// not yet cut into a batch, across all ranges) to at most what the stream
// acknowledged over the last target of time plus the network's round trip
// to the leader (the least recent round trip less the time the leader
// reports spending on the batch): by Little's law, past capacity a record
// then waits about the target before it is sent and about as long in its
// batch's round trip, instead of the seconds a full BufferedBytesMax takes
// to drain. Records in flight do not count against it, so below capacity,
// with a batch in flight and the next gathering behind it, the bound binds
// only when the server's part of a round trip alone exceeds the target; a
// far leader's network round trip does not make it bind. Past the bound,
// Produce blocks until there is room (bounded by its context and the
// delivery timeout), or fails at once with FailWhenFull. All bytes held,
// unsent and in flight, are bounded by twice that bound (a producer over
// many ranges has a batch in flight on each). The bound starts at 64 KiB,
// moves within a factor of two per window (the target plus the network's
// round trip), and stays between 64 KiB and BufferedBytesMax.
func QueueDelayTarget(d time.Duration) ProducerOpt {
	return func(c *producerConfig) { c.queueDelayTarget = d }
}

// FailWhenFull makes Produce fail a record at once, when the producer's
// bound (QueueDelayTarget's or BufferedBytesMax) is reached, instead of
// blocking, which is the default. The record's callback then gets a
// retriable OVERLOADED whose cause is ErrBufferFull (errors.Is), with
// RetryAfter set to the delay target: nothing was sent, so producing the
// record again is safe. Like Kafka's max.block.ms=0.
func FailWhenFull() ProducerOpt { return func(c *producerConfig) { c.failWhenFull = true } }

// AppendAttemptTimeout bounds how long a range's append stream may answer
// nothing while batches are in flight on it, overriding the default of
// AppendAttemptTimeoutDefault (1 s), plus 1 s per MiB of the oldest
// unanswered batch; it is capped at DeliveryTimeout, and 0 turns it off.
// The wait runs from that batch's send or the stream's last reply,
// whichever is later. When it passes, the range treats the node as down (a
// paused or cut-off leader answers nothing, while the others elect a new
// leader within about a second): it resends every unacknowledged batch at
// once to another address, with the same producer id and sequences (an
// idempotent producer's batch lands once: a range that has it answers the
// resend as a duplicate with the original offsets), and follows no leader
// hint back to that node for the same duration. Set it above the longest
// time a healthy leader may take to answer a batch (a slow disk, a long
// round trip); a timeout that passes on a healthy leader costs a
// reconnection and a resend, not a record. Without idempotence
// (DisableIdempotence) a resend may append a batch twice.
func AppendAttemptTimeout(d time.Duration) ProducerOpt {
	return func(c *producerConfig) { c.attemptTimeout = d }
}

// DisableIdempotence sends batches without a producer id, overriding the
// default of idempotent appends. Retries may then append a batch twice.
func DisableIdempotence() ProducerOpt { return func(c *producerConfig) { c.idempotent = false } }

// ProducerRetryBackoff sets the bounds of the jittered exponential backoff
// before a range reconnects and resends, overriding the client's
// RetryBackoff (default 100ms and 2s).
func ProducerRetryBackoff(min, max time.Duration) ProducerOpt {
	return func(c *producerConfig) { c.backoffMin, c.backoffMax = min, max }
}

// ProducerID sets the initial producer id, overriding the default of a
// random non-zero id from crypto/rand. Ids must be unique among a stream's
// producers; this exists for tests and tools.
func ProducerID(id uint64) ProducerOpt { return func(c *producerConfig) { c.producerID = id } }

// WithTiming makes every append ask its range leader where its time went,
// and every ProduceResult carry a Timing: the record's wait in the
// producer, the round trip of its batch, and the leader's stages. It adds
// a few dozen bytes to each reply; benchmarks and latency investigations
// use it (geolog bench --breakdown).
func WithTiming() ProducerOpt { return func(c *producerConfig) { c.timing = true } }

// WithRecordsForm makes the producer send its batches as protobuf records
// (AppendRequest.records), which the range leader decodes and encodes
// again, instead of the default batch form (AppendRequest.batch: the
// log's own frame, which the leader checks and writes as it came). It is
// for servers older than the batch form, tests and comparisons.
func WithRecordsForm() ProducerOpt { return func(c *producerConfig) { c.recordsForm = true } }

func (c *producerConfig) validate() error {
	switch {
	case c.linger < 0:
		return fmt.Errorf("client: Linger %v is negative", c.linger)
	case c.batchBytesMax < 1:
		return fmt.Errorf("client: BatchBytesMax %d is not positive", c.batchBytesMax)
	case c.inflightBatchesMax < 1 || c.inflightBatchesMax > InflightBatchesMaxLimit:
		return fmt.Errorf("client: InflightBatchesMax %d is outside [1, %d]", c.inflightBatchesMax, InflightBatchesMaxLimit)
	case c.bufferedBytesMax < int64(c.batchBytesMax):
		return fmt.Errorf("client: BufferedBytesMax %d is below BatchBytesMax %d", c.bufferedBytesMax, c.batchBytesMax)
	case c.deliveryTimeout < 0:
		return fmt.Errorf("client: DeliveryTimeout %v is negative", c.deliveryTimeout)
	case c.queueDelayTarget < 0:
		return fmt.Errorf("client: QueueDelayTarget %v is negative", c.queueDelayTarget)
	case c.attemptTimeout < 0:
		return fmt.Errorf("client: AppendAttemptTimeout %v is negative", c.attemptTimeout)
	case c.backoffMin <= 0 || c.backoffMax < c.backoffMin:
		return fmt.Errorf("client: ProducerRetryBackoff(%v, %v): min must be positive and max >= min", c.backoffMin, c.backoffMax)
	}
	return nil
}
