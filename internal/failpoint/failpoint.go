// Package failpoint holds geologd's fault switches for chaos tests: a slow
// or failing fsync (vfs.Faults under every range's store) and a skewed
// clock (the node's Config.Now). They are off by default and settable at run
// time only when geologd runs with --debug-failpoints, over HTTP on its
// --debug-addr:
//
//	curl 127.0.0.1:7601/debug/failpoints
//	curl -X POST -d '{"fsync_delay":"200ms","fsync_fail":false,"clock_skew":"-2s"}' 127.0.0.1:7601/debug/failpoints
//
// A POST replaces every setting (send the full Settings; the zero value
// clears them all) and answers with the settings now in force.
package failpoint

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/geolog/geolog/vfs"
)

// Path is where Handler is served on the debug address.
const Path = "/debug/failpoints"

// ClockSkewMax bounds the clock skew either way.
const ClockSkewMax = 24 * time.Hour

// settingsBytesMax bounds a POST body.
const settingsBytesMax = 4 << 10

// Settings are the switches' values, as JSON on the wire.
type Settings struct {
	// FsyncDelay delays every fdatasync of the node's range stores (a slow
	// disk), at most vfs.SyncDelayMax.
	FsyncDelay Duration `json:"fsync_delay"`
	// FsyncFail fails every fdatasync with vfs.ErrInjected (a failing
	// disk). A store that saw a failed fdatasync refuses writes for good,
	// as after a real one: the node's replicas of those ranges stop until
	// it restarts.
	FsyncFail bool `json:"fsync_fail"`
	// ClockSkew is added to the node's clock (append times, retention,
	// lag, and leases once homing reads Config.Now), within ±ClockSkewMax.
	ClockSkew Duration `json:"clock_skew"`
}

// Validate checks the bounds.
func (s Settings) Validate() error {
	if d := time.Duration(s.FsyncDelay); d < 0 || d > vfs.SyncDelayMax {
		return fmt.Errorf("failpoint: fsync_delay %v is outside [0, %v]", d, vfs.SyncDelayMax)
	}
	if d := time.Duration(s.ClockSkew); d < -ClockSkewMax || d > ClockSkewMax {
		return fmt.Errorf("failpoint: clock_skew %v is outside ±%v", d, ClockSkewMax)
	}
	return nil
}

// Set is one node's switches. The zero value injects nothing.
type Set struct {
	// Faults goes to vfs.WithFaults around the node's file system.
	Faults    vfs.Faults
	skewNanos atomic.Int64
	mu        sync.Mutex // serialises Apply
}

// Now is the node's clock: time.Now plus the clock skew.
func (s *Set) Now() time.Time { return time.Now().Add(time.Duration(s.skewNanos.Load())) }

// Apply validates and installs settings.
func (s *Set) Apply(settings Settings) error {
	if err := settings.Validate(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.Faults.SetSyncDelay(time.Duration(settings.FsyncDelay))
	s.Faults.SetSyncFail(settings.FsyncFail)
	s.skewNanos.Store(int64(settings.ClockSkew))
	return nil
}

// Settings returns the settings in force.
func (s *Set) Settings() Settings {
	return Settings{
		FsyncDelay: Duration(s.Faults.SyncDelay()),
		FsyncFail:  s.Faults.SyncFail(),
		ClockSkew:  Duration(s.skewNanos.Load()),
	}
}

// Handler serves GET and POST Path; a bad POST answers 400 and changes
// nothing.
func (s *Set) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Method {
		case http.MethodGet:
		case http.MethodPost, http.MethodPut:
			var in Settings
			dec := json.NewDecoder(io.LimitReader(r.Body, settingsBytesMax))
			dec.DisallowUnknownFields()
			err := dec.Decode(&in)
			if err == nil {
				err = s.Apply(in)
			}
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
		default:
			http.Error(w, "GET or POST", http.StatusMethodNotAllowed)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(s.Settings())
	})
}

// Duration is a time.Duration that reads and writes JSON as "1.5s".
type Duration time.Duration

// MarshalText writes d as time.Duration.String does.
func (d Duration) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }

// UnmarshalText parses what time.ParseDuration accepts.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}
