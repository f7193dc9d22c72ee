package wan

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/hashicorp/go-hclog"
)

// Bounds and defaults of the control server and its file config.
const (
	// DefaultLatencyMin and DefaultLatencyMax bound the per-pair latency a
	// link gets when neither it nor the file sets one (SymmetricLatency).
	DefaultLatencyMin = 30 * time.Millisecond
	DefaultLatencyMax = 80 * time.Millisecond
	// configBytesMax bounds a config file; linksMax its links.
	configBytesMax = 1 << 20
	linksMax       = 4096
	// shutdownTimeout bounds the control server's graceful shutdown.
	shutdownTimeout = 5 * time.Second
	defaultControl  = "127.0.0.1:0"
)

// Duration is a time.Duration in JSON: a string such as "40ms" or "1.5s",
// or a number of milliseconds.
type Duration time.Duration

// UnmarshalJSON accepts "40ms" or 40 (milliseconds).
func (d *Duration) UnmarshalJSON(b []byte) error {
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		v, err := time.ParseDuration(s)
		if err != nil {
			return err
		}
		*d = Duration(v)
		return nil
	}
	ms, err := strconv.ParseFloat(string(b), 64)
	if err != nil || !(ms >= -1e9 && ms <= 1e9) {
		return fmt.Errorf("duration %s: want a string like \"40ms\" or a number of milliseconds", b)
	}
	*d = Duration(ms * float64(time.Millisecond))
	return nil
}

// MarshalJSON writes the duration as a string, e.g. "40ms".
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// FileConfig is geolog-wan's JSON config file:
//
//	{
//	  "control": "127.0.0.1:7600",
//	  "seed": 1,
//	  "jitter": "2ms",
//	  "links": [
//	    {"name": "us-east->eu-west.n1", "listen": "127.0.0.1:17001",
//	     "upstream": "127.0.0.1:7411", "latency": "40ms"},
//	    {"name": "eu-west->pg", "listen": "127.0.0.1:17100",
//	     "upstream": "127.0.0.1:5432", "latency": 35, "jitter": "1ms"}
//	  ]
//	}
//
// Unknown fields are refused.
type FileConfig struct {
	// Control is the control API's listen address, default 127.0.0.1:0.
	Control string `json:"control"`
	// Seed seeds the jitter and the default latencies.
	Seed uint64 `json:"seed"`
	// Latency and Jitter are the defaults of links that set none. Without
	// a Latency, each pair of regions gets SymmetricLatency(seed, from, to,
	// 30ms, 80ms) (the name stands in for regions a link lacks).
	Latency *Duration  `json:"latency,omitempty"`
	Jitter  *Duration  `json:"jitter,omitempty"`
	Links   []FileLink `json:"links"`
}

// FileLink is one link of a FileConfig; fields as in Config.
type FileLink struct {
	Name                    string    `json:"name"`
	From                    string    `json:"from,omitempty"`
	To                      string    `json:"to,omitempty"`
	Listen                  string    `json:"listen"`
	Upstream                string    `json:"upstream"`
	Latency                 *Duration `json:"latency,omitempty"`
	Jitter                  *Duration `json:"jitter,omitempty"`
	BandwidthBytesPerSecond int64     `json:"bandwidth_bytes_per_second,omitempty"`
	BufferBytesMax          int       `json:"buffer_bytes_max,omitempty"`
	ConnsMax                int       `json:"conns_max,omitempty"`
}

// ParseFileConfig decodes and checks a FileConfig and resolves it into a
// ServerConfig. Every problem is a *ConfigError (errors.Is
// ErrInvalidConfig).
func ParseFileConfig(data []byte) (ServerConfig, error) {
	fc, err := DecodeFileConfig(data)
	if err != nil {
		return ServerConfig{}, err
	}
	return fc.ServerConfig()
}

// DecodeFileConfig decodes a FileConfig strictly (one JSON object, no
// unknown fields, at most 1 MiB) without checking its values, so that a
// caller can amend it (flags) before calling ServerConfig.
func DecodeFileConfig(data []byte) (FileConfig, error) {
	if len(data) > configBytesMax {
		return FileConfig{}, configErrorf("", "file", "larger than %d bytes", configBytesMax)
	}
	var fc FileConfig
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&fc); err != nil {
		return FileConfig{}, configErrorf("", "file", "%v", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return FileConfig{}, configErrorf("", "file", "data after the JSON object")
	}
	return fc, nil
}

// ServerConfig resolves the defaults of fc into link Configs and checks
// them all, names and listen addresses unique included.
func (fc FileConfig) ServerConfig() (ServerConfig, error) {
	sc := ServerConfig{ControlListen: fc.Control}
	if len(fc.Links) > linksMax {
		return ServerConfig{}, configErrorf("", "links", "more than %d", linksMax)
	}
	for _, fl := range fc.Links {
		cfg := Config{
			Name: fl.Name, From: fl.From, To: fl.To,
			Listen: fl.Listen, Upstream: fl.Upstream,
			BandwidthBytesPerSecond: fl.BandwidthBytesPerSecond,
			BufferBytesMax:          fl.BufferBytesMax,
			ConnsMax:                fl.ConnsMax,
			Seed:                    fc.Seed,
		}
		if cfg.From == "" && cfg.To == "" {
			cfg.From, cfg.To, _ = RegionsFromName(cfg.Name)
		}
		switch {
		case fl.Latency != nil:
			cfg.Latency = time.Duration(*fl.Latency)
		case fc.Latency != nil:
			cfg.Latency = time.Duration(*fc.Latency)
		default:
			a, b := cfg.From, cfg.To
			if a == "" || b == "" {
				a, b = cfg.Name, ""
			}
			cfg.Latency = SymmetricLatency(fc.Seed, a, b, DefaultLatencyMin, DefaultLatencyMax)
		}
		switch {
		case fl.Jitter != nil:
			cfg.Jitter = time.Duration(*fl.Jitter)
		case fc.Jitter != nil:
			cfg.Jitter = time.Duration(*fc.Jitter)
		}
		sc.Links = append(sc.Links, cfg)
	}
	if err := sc.check(); err != nil {
		return ServerConfig{}, err
	}
	return sc, nil
}

// ServerConfig configures a Server.
type ServerConfig struct {
	// ControlListen is the control API's address, default 127.0.0.1:0.
	ControlListen string
	// Links are started in order; each gets Logger unless it has its own.
	Links []Config
	// Logger defaults to a null logger.
	Logger hclog.Logger
}

// check validates every link on a copy and refuses duplicate names and
// listen addresses, so that nothing starts from a bad config.
func (sc *ServerConfig) check() error {
	if sc.ControlListen != "" {
		if err := checkHostPort(sc.ControlListen, true); err != nil {
			return configErrorf("", "control", "%s", err)
		}
	}
	names := make(map[string]int, len(sc.Links))
	listens := make(map[string]int, len(sc.Links))
	for i, cfg := range sc.Links {
		field := fmt.Sprintf("links[%d]", i)
		if err := cfg.validate(); err != nil {
			var ce *ConfigError
			if errors.As(err, &ce) {
				return configErrorf(ce.Link, field+"."+ce.Field, "%s", ce.Reason)
			}
			return err
		}
		if j, ok := names[cfg.Name]; ok {
			return configErrorf(cfg.Name, field+".name", "same name as links[%d]", j)
		}
		names[cfg.Name] = i
		if _, port, _ := net.SplitHostPort(cfg.Listen); port != "0" {
			if j, ok := listens[cfg.Listen]; ok {
				return configErrorf(cfg.Name, field+".listen", "same address as links[%d]", j)
			}
			listens[cfg.Listen] = i
		}
	}
	return nil
}

// Server runs a Net of links and the HTTP control API over it: the body of
// geolog-wan, importable so that tests can run it in-process.
type Server struct {
	net    *Net
	http   *http.Server
	ln     net.Listener
	logger hclog.Logger
	served chan struct{}
}

// StartServer checks cfg, starts every link and the control API. On error
// nothing is left running.
func StartServer(cfg ServerConfig) (*Server, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	if cfg.ControlListen == "" {
		cfg.ControlListen = defaultControl
	}
	n := NewNet(cfg.Logger)
	for _, lc := range cfg.Links {
		if _, err := n.Add(lc); err != nil {
			_ = n.Close()
			return nil, err
		}
	}
	ln, err := net.Listen("tcp", cfg.ControlListen)
	if err != nil {
		_ = n.Close()
		return nil, fmt.Errorf("wan: control listener: %w", err)
	}
	s := &Server{
		net:    n,
		ln:     ln,
		logger: cfg.Logger,
		served: make(chan struct{}),
		http: &http.Server{
			Handler:           NewControlHandler(n, cfg.Logger),
			ReadHeaderTimeout: 5 * time.Second,
			ReadTimeout:       10 * time.Second,
			WriteTimeout:      10 * time.Second,
			IdleTimeout:       time.Minute,
			MaxHeaderBytes:    64 << 10,
		},
	}
	go func() {
		defer close(s.served)
		if err := s.http.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.logger.Error("control server failed", "error", err)
		}
	}()
	cfg.Logger.Info("wan started", "control", ln.Addr().String(), "links", len(cfg.Links))
	return s, nil
}

// ControlAddr returns the control API's address.
func (s *Server) ControlAddr() string { return s.ln.Addr().String() }

// Net returns the server's links.
func (s *Server) Net() *Net { return s.net }

// Close stops the control API (letting requests in progress finish, for at
// most 5 s) and closes every link.
func (s *Server) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	err := s.http.Shutdown(ctx)
	<-s.served
	return errors.Join(err, s.net.Close())
}

// Run starts a Server, calls ready (if not nil) with it, and closes it when
// ctx is done: what geolog-wan's main does between flags and exit.
func Run(ctx context.Context, cfg ServerConfig, ready func(*Server)) error {
	s, err := StartServer(cfg)
	if err != nil {
		return err
	}
	if ready != nil {
		ready(s)
	}
	<-ctx.Done()
	s.logger.Info("wan stopping")
	return s.Close()
}
