package main

import (
	"flag"
	"fmt"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/geolog/geolog/regionsvc"
	"github.com/hashicorp/go-hclog"
)

// limitFlags are geologd's flags for the node's resource bounds
// (regionsvc.LimitsConfig) and the process's memory limit.
type limitFlags struct {
	memoryLimit                      byteSize
	gcPercent                        *int
	batchBytesMax                    byteSize
	appendInflight, readInflight     byteSize
	receiving, waiting               *int
	streamsPerConn                   *int
	connections, connectionsPerAddr  *int
	handshakeTimeout, connectionIdle *time.Duration
	subscriberSendTimeout            *time.Duration
	rangesMax, fileDescriptorsMax    *int
	quotaRequests, quotaBytes        *float64
}

func addLimitFlags(fs *flag.FlagSet) *limitFlags {
	f := &limitFlags{}
	fs.Var(&f.memoryLimit, "memory-limit", "the Go runtime's soft memory limit (GOMEMLIMIT), e.g. 1GiB; 0 keeps GOMEMLIMIT or none")
	f.gcPercent = fs.Int("gc-percent", 0, fmt.Sprintf("the Go GC's heap growth percent (GOGC); 0: GOGC if set, else %d", gcPercentDefault))
	fs.Var(&f.batchBytesMax, "batch-bytes-max", "largest append batch accepted, encoded (default 16MiB); every message the node takes is bounded by it plus 1 MiB")
	fs.Var(&f.appendInflight, "append-bytes-inflight-max", "bytes of appends held between receipt and answer, node-wide (default 128MiB); past it appends get OVERLOADED")
	fs.Var(&f.readInflight, "read-bytes-inflight-max", "bytes of reads and subscription messages being sent, node-wide (default 128MiB)")
	f.receiving = fs.Int("requests-receiving-max", 0, "client requests being read and decoded at once, each up to the receive limit (default 8; AppendStream aside)")
	f.waiting = fs.Int("requests-waiting-max", 0, "client requests admitted to wait for a receive slot, each holding at most a stream window (4MiB) (default 256, 1GiB at worst; under --memory-limit, as many as hold a quarter of it, at least 16)")
	f.streamsPerConn = fs.Int("streams-per-connection-max", 0, "concurrent RPCs per connection (default 1024)")
	f.connections = fs.Int("connections-max", 0, "inbound connections (default a quarter of RLIMIT_NOFILE, raised to its hard limit at start)")
	f.connectionsPerAddr = fs.Int("connections-per-address-max", 0, "inbound connections from one address (default half of --connections-max)")
	f.handshakeTimeout = fs.Duration("handshake-timeout", 0, "bound on a new connection's handshakes (default 10s)")
	f.connectionIdle = fs.Duration("connection-idle-max", 0, "close connections without an RPC for this long (default 15m)")
	f.subscriberSendTimeout = fs.Duration("subscriber-send-timeout", 0, "cut off a subscriber that takes no message for this long (default 30s)")
	f.rangesMax = fs.Int("ranges-max", 0, "ranges this node may host; creates past it are refused (default 16384: memory, about 20 KiB of heap and three goroutines per idle range)")
	f.fileDescriptorsMax = fs.Int("file-descriptors-max", 0, "descriptors the ranges' files hold at once, node-wide; idle files past it are closed, least recently used first, and reopened on use (default half of what --connections-max leaves of RLIMIT_NOFILE)")
	f.quotaRequests = fs.Float64("quota-requests-per-second", 0, "per client (peer address until identities): requests per second; 0 means no quota")
	f.quotaBytes = fs.Float64("quota-bytes-per-second", 0, "per client: bytes appended or read per second; 0 means no quota")
	return f
}

// apply raises RLIMIT_NOFILE, sets the memory limit and fills cfg.
func (f *limitFlags) apply(cfg *regionsvc.Config, logger hclog.Logger) {
	if n, err := regionsvc.RaiseFileLimit(); err != nil {
		logger.Warn("could not raise the open files limit", "error", err)
	} else {
		logger.Debug("open files limit", "nofile", n)
	}
	if p := gcPercent(os.Getenv("GOGC"), *f.gcPercent); p != 0 {
		debug.SetGCPercent(p)
		logger.Debug("gc percent", "percent", p)
	}
	if f.memoryLimit > 0 {
		debug.SetMemoryLimit(int64(f.memoryLimit))
		logger.Info("memory limit", "bytes", int64(f.memoryLimit))
	}
	cfg.BatchBytesMax = int(f.batchBytesMax)
	cfg.Limits = regionsvc.LimitsConfig{
		AppendBytesInflightMax:   int64(f.appendInflight),
		ReadBytesInflightMax:     int64(f.readInflight),
		RequestsReceivingMax:     *f.receiving,
		RequestsWaitingMax:       *f.waiting,
		StreamsPerConnectionMax:  *f.streamsPerConn,
		ConnectionsMax:           *f.connections,
		ConnectionsPerAddressMax: *f.connectionsPerAddr,
		HandshakeTimeout:         *f.handshakeTimeout,
		ConnectionIdleMax:        *f.connectionIdle,
		SubscriberSendTimeout:    *f.subscriberSendTimeout,
		RangesMax:                *f.rangesMax,
		FileDescriptorsMax:       *f.fileDescriptorsMax,
		QuotaRequestsPerSecond:   *f.quotaRequests,
		QuotaBytesPerSecond:      *f.quotaBytes,
	}
}

// gcPercentDefault is geologd's GOGC unless GOGC or --gc-percent says
// otherwise. Go's own 100 collects whenever the heap doubles: a node's live
// heap is small (12-16 MB with 24 busy ranges) while it allocates ~100 MB/s
// per 20k appends/s (request buffers, Raft entries, frames), so at 100 it
// collected 7-8 times a second and the collector (background marking plus
// the assists it charges to the append path) took 10-13% of the nodes' CPU
// at half rate (notes/tail.md). At 400 it collects a quarter as often, for
// a heap of about five times the live one; --memory-limit (GOMEMLIMIT)
// still bounds it, the runtime collecting earlier as the heap nears it.
const gcPercentDefault = 400

// gcPercent is the GC percent geologd sets: the flag's if given, nothing
// (0: the runtime keeps GOGC) if the environment sets GOGC, else
// gcPercentDefault. A negative flag turns the collector off (as GOGC=off),
// leaving only the memory limit.
func gcPercent(env string, flag int) int {
	switch {
	case flag != 0:
		return flag
	case env != "":
		return 0
	}
	return gcPercentDefault
}

// byteSize is a flag of bytes: a number with an optional KiB, MiB, GiB,
// KB, MB or GB suffix.
type byteSize int64

func (b *byteSize) String() string { return strconv.FormatInt(int64(*b), 10) }

func (b *byteSize) Set(s string) error {
	units := []struct {
		suffix string
		mult   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"B", 1}}
	mult := int64(1)
	for _, u := range units {
		if strings.HasSuffix(s, u.suffix) {
			s, mult = strings.TrimSuffix(s, u.suffix), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	if err != nil || n < 0 || n > (1<<62)/mult {
		return fmt.Errorf("%q is not a size (e.g. 512MiB)", s)
	}
	*b = byteSize(n * mult)
	return nil
}
