package wan

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
)

// Bounds every Config and run-time setting is checked against.
const (
	// LatencyMax bounds the one-way latency and, separately, the jitter.
	LatencyMax = 10 * time.Second
	// BufferBytesMin and BufferBytesMax bound Config.BufferBytesMax.
	BufferBytesMin = blockBytes
	BufferBytesMax = 1 << 30
	// ConnsMaxLimit bounds Config.ConnsMax.
	ConnsMaxLimit = 1 << 16
	// nameBytesMax bounds link and region names.
	nameBytesMax = 128
)

// Defaults of Config.
const (
	defaultListen         = "127.0.0.1:0"
	defaultBufferBytesMax = 8 << 20
	defaultConnsMax       = 1024
	defaultDialTimeout    = 5 * time.Second
)

// CutMode says how a cut link treats its connections.
type CutMode int

const (
	// CutBlackhole stalls the link like a network partition: bytes already
	// inside the proxy are held, nothing more is read from either socket
	// (so the senders' socket buffers fill and their writes block), and new
	// connections are accepted but neither dialled upstream nor read until
	// the link heals. Heal delivers everything held, in order.
	CutBlackhole CutMode = iota + 1
	// CutReset resets every connection (RST to both ends; held bytes are
	// dropped) and resets new connections as soon as they are accepted,
	// before any byte passes.
	CutReset
)

// String returns "blackhole" or "reset".
func (m CutMode) String() string {
	switch m {
	case CutBlackhole:
		return "blackhole"
	case CutReset:
		return "reset"
	default:
		return "CutMode(" + strconv.Itoa(int(m)) + ")"
	}
}

// ParseCutMode parses "blackhole" or "reset"; the empty string means
// blackhole. Anything else is ErrInvalidArgument.
func ParseCutMode(s string) (CutMode, error) {
	switch s {
	case "", "blackhole":
		return CutBlackhole, nil
	case "reset":
		return CutReset, nil
	default:
		return 0, fmt.Errorf("%w: cut mode %q (want blackhole or reset)", ErrInvalidArgument, s)
	}
}

// Config configures one Link. Zero values take the documented defaults;
// NewLink validates the rest and refuses bad values with a *ConfigError.
type Config struct {
	// Name names the link in logs, stats and a Net, e.g.
	// "us-east->eu-west.n1": letters, digits and ". _ : - >", at most 128
	// bytes. Default: From + "->" + To when both are set; required
	// otherwise.
	Name string
	// From and To are the regions (or any group names: "pg" for the lease
	// store) the link joins: clients in From reach a server in To through
	// it. Optional; Net's region helpers (CutRegion, Partition) select
	// links by them. When both are empty and Name has the form
	// FROM->TO[.SUFFIX], they are taken from Name.
	From, To string
	// Listen is the address clients dial, default "127.0.0.1:0" (a free
	// port: read it back with Addr).
	Listen string
	// Upstream is the address the link forwards to. Required.
	Upstream string
	// Latency is the one-way delay added in each direction, default 0.
	// At most LatencyMax.
	Latency time.Duration
	// Jitter bounds the extra random delay: each chunk read is delayed by
	// Latency + a uniform draw in [0, Jitter], then clamped so that no
	// chunk overtakes an earlier one of its direction. Default 0, at most
	// LatencyMax.
	Jitter time.Duration
	// BandwidthBytesPerSecond caps each direction of the link, shared by
	// all its connections (a WAN link's capacity is shared). 0, the
	// default, means no cap.
	BandwidthBytesPerSecond int64
	// BufferBytesMax bounds the bytes one direction of one connection
	// holds (in flight plus held by a cut), default 8 MiB, at least 64 KiB.
	// It caps one connection's throughput at about BufferBytesMax divided by
	// the one-way delay (8 MiB / 40 ms ≈ 200 MiB/s). With a bandwidth cap
	// it is also the bottleneck's queue.
	BufferBytesMax int
	// ConnsMax bounds the link's open connections (held ones included),
	// default 1024; more are reset on accept and counted as refused.
	ConnsMax int
	// DialTimeout bounds dialling Upstream, default 5 s. A failed dial
	// resets the client's connection.
	DialTimeout time.Duration
	// Seed seeds the jitter draws; each direction of each connection draws
	// from its own generator, seeded with (Seed, connection number,
	// direction).
	Seed uint64
	// Logger defaults to a null logger; the link names it "wan".
	Logger hclog.Logger
}

// validate checks cfg and fills in defaults. It returns a *ConfigError.
func (c *Config) validate() error {
	if c.From == "" && c.To == "" {
		if from, to, ok := RegionsFromName(c.Name); ok {
			c.From, c.To = from, to
		}
	}
	if c.Name == "" && c.From != "" && c.To != "" {
		c.Name = c.From + "->" + c.To
	}
	if err := checkName(c.Name, true); err != nil {
		return configErrorf(c.Name, "Name", "%s", err)
	}
	if err := checkName(c.From, false); err != nil {
		return configErrorf(c.Name, "From", "%s", err)
	}
	if err := checkName(c.To, false); err != nil {
		return configErrorf(c.Name, "To", "%s", err)
	}
	if c.Listen == "" {
		c.Listen = defaultListen
	}
	if err := checkHostPort(c.Listen, true); err != nil {
		return configErrorf(c.Name, "Listen", "%s", err)
	}
	if c.Upstream == "" {
		return configErrorf(c.Name, "Upstream", "required")
	}
	if err := checkHostPort(c.Upstream, false); err != nil {
		return configErrorf(c.Name, "Upstream", "%s", err)
	}
	if err := checkLatency(c.Latency, c.Jitter); err != nil {
		return configErrorf(c.Name, "Latency", "%s", err)
	}
	if c.BandwidthBytesPerSecond < 0 {
		return configErrorf(c.Name, "BandwidthBytesPerSecond", "must not be negative, got %d", c.BandwidthBytesPerSecond)
	}
	switch {
	case c.BufferBytesMax == 0:
		c.BufferBytesMax = defaultBufferBytesMax
	case c.BufferBytesMax < BufferBytesMin || c.BufferBytesMax > BufferBytesMax:
		return configErrorf(c.Name, "BufferBytesMax", "must be in [%d, %d], got %d", BufferBytesMin, BufferBytesMax, c.BufferBytesMax)
	}
	switch {
	case c.ConnsMax == 0:
		c.ConnsMax = defaultConnsMax
	case c.ConnsMax < 0 || c.ConnsMax > ConnsMaxLimit:
		return configErrorf(c.Name, "ConnsMax", "must be in [1, %d], got %d", ConnsMaxLimit, c.ConnsMax)
	}
	switch {
	case c.DialTimeout == 0:
		c.DialTimeout = defaultDialTimeout
	case c.DialTimeout < 0:
		return configErrorf(c.Name, "DialTimeout", "must not be negative, got %s", c.DialTimeout)
	}
	if c.Logger == nil {
		c.Logger = hclog.NewNullLogger()
	}
	return nil
}

// checkLatency bounds a latency and a jitter; the error is unwrapped text
// for the caller to type.
func checkLatency(latency, jitter time.Duration) error {
	if latency < 0 || latency > LatencyMax {
		return fmt.Errorf("latency must be in [0, %s], got %s", LatencyMax, latency)
	}
	if jitter < 0 || jitter > LatencyMax {
		return fmt.Errorf("jitter must be in [0, %s], got %s", LatencyMax, jitter)
	}
	return nil
}

// checkName accepts names made of letters, digits and ". _ : - >", at most
// nameBytesMax bytes; "/" and spaces are refused so that a name is one path
// segment of the control API.
func checkName(name string, required bool) error {
	if name == "" {
		if required {
			return fmt.Errorf("required")
		}
		return nil
	}
	if len(name) > nameBytesMax {
		return fmt.Errorf("longer than %d bytes", nameBytesMax)
	}
	for i := 0; i < len(name); i++ {
		b := name[i]
		switch {
		case b >= 'a' && b <= 'z', b >= 'A' && b <= 'Z', b >= '0' && b <= '9':
		case b == '.' || b == '_' || b == ':' || b == '-' || b == '>':
		default:
			return fmt.Errorf("%q: byte %q not allowed (letters, digits, . _ : - >)", name, b)
		}
	}
	return nil
}

// checkHostPort accepts host:port with a numeric port (0 only when
// listening).
func checkHostPort(addr string, listen bool) error {
	host, portText, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%q: %v", addr, err)
	}
	if !listen && host == "" {
		return fmt.Errorf("%q: host required", addr)
	}
	port, err := strconv.Atoi(portText)
	if err != nil || port < 0 || port > 65535 || (!listen && port == 0) {
		return fmt.Errorf("%q: bad port %q", addr, portText)
	}
	return nil
}

// RegionsFromName splits a link name of the form FROM->TO[.SUFFIX] (the
// suffix tells apart several links of one pair of regions, e.g.
// "us-east->eu-west.n2") into its regions. ok is false for any other form.
func RegionsFromName(name string) (from, to string, ok bool) {
	from, rest, found := strings.Cut(name, "->")
	if !found || from == "" || rest == "" || strings.Contains(rest, ">") {
		return "", "", false
	}
	to, _, _ = strings.Cut(rest, ".")
	if to == "" || strings.ContainsAny(from, ".>") {
		return "", "", false
	}
	return from, to, true
}
