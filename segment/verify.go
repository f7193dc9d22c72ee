package segment

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"sort"
	"strings"

	"github.com/hashicorp/go-hclog"
)

// VerifyReport is what Verify found in a range's directory.
type VerifyReport struct {
	// Segments is the number of segment log files, Bytes their size.
	Segments int
	Bytes    int64
	// StartOffset and NextOffset bound the records the log holds.
	StartOffset, NextOffset uint64
	// RecordedStart is the start retention recorded (RecordedStartOK false:
	// no record yet, a log that was never opened by this version).
	RecordedStart   uint64
	RecordedStartOK bool
	// TornTailBytes is the torn tail Open would cut off the last segment
	// (an interrupted write: normal after a crash, not a problem).
	TornTailBytes int64
	// PaddingBytes is zero-ahead's zeros past the last segment's last
	// frame that Open would cut off (zeroahead.go: left by a crash, or by
	// a node that was killed; not a problem).
	PaddingBytes int64
	// Repairs lists what Open would rebuild or remove beside the log:
	// index files missing or stale, key index files, orphan index files.
	// Index files are caches; a missing one is no problem.
	Repairs []string
	// Damaged lists index or key index files present but failing their
	// checks (CRC, structure, entries the log does not bear out): Open
	// rebuilds them, but they say the disk changed bytes behind the store.
	Damaged []string
	// InstallPending says an install (a Raft snapshot) committed and was
	// not rolled forward: Open completes it, and the segments checked are
	// partly the old log's.
	InstallPending bool
}

// Verify checks the log in cfg.Dir as Open would, offline, and changes
// nothing on disk: it locks the directory (ErrLocked while a store has it
// open: stop the node first), reads the start record, and makes recovery's
// pass over every segment (CRCs, offsets, Raft indexes, segment names,
// index and key index files against the log), without truncating a torn
// tail or rewriting anything. The error is what Open would refuse the log
// for (a *CorruptionError, with a *MissingError for lost segments; a key
// the keyring lacks; an I/O error); the report says what Open would
// repair. cfg.OnRecover is ignored; cfg.Keyring opens sealed frames.
func Verify(cfg Config) (*VerifyReport, error) {
	cfg.OnRecover = nil
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if _, err := cfg.FS.Stat(cfg.Dir); err != nil {
		return nil, fmt.Errorf("segment: %w", err)
	}
	lock, err := cfg.FS.Lock(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrLocked, err)
	}
	defer lock.Close()
	s := &Store{cfg: cfg, fs: cfg.FS, log: cfg.Logger}
	rep := &VerifyReport{}
	if s.startRec, err = s.loadStartRecord(); err != nil {
		return rep, err
	}
	rep.RecordedStart, rep.RecordedStartOK = s.startRec.start, s.startRec.ok
	if _, err := cfg.FS.Stat(filepath.Join(cfg.Dir, manifestName)); err == nil {
		rep.InstallPending = true
	} else if !errors.Is(err, fs.ErrNotExist) {
		return rep, fmt.Errorf("segment: stat install manifest: %w", err)
	}
	segs, plan, err := s.scanSegments(nil)
	if err != nil {
		return rep, err
	}
	defer func() {
		for _, g := range segs {
			g.f.Close()
		}
	}()
	rep.Segments = len(segs)
	if len(segs) > 0 {
		rep.StartOffset, rep.NextOffset = segs[0].baseOffset, segs[len(segs)-1].nextOffset
	} else {
		rep.StartOffset, rep.NextOffset = s.startRec.start, s.startRec.start
	}
	for _, g := range segs {
		rep.Bytes += g.size
	}
	switch {
	case plan.tornAt >= 0 && plan.padding:
		rep.PaddingBytes = plan.tornBytes
	case plan.tornAt >= 0:
		rep.TornTailBytes = plan.tornBytes
		rep.Bytes += plan.tornBytes // on disk until Open cuts it
	}
	note := func(g *segment, what, reason string) {
		line := fmt.Sprintf("%s: %s %s", g.name(), what, reason)
		if isMissingReason(reason) {
			rep.Repairs = append(rep.Repairs, line)
		} else {
			rep.Damaged = append(rep.Damaged, line)
		}
	}
	for g, reason := range plan.indexRewrite {
		note(g, "index", reason)
	}
	for g, reason := range plan.keyRewrite {
		note(g, "key index", reason)
	}
	for _, g := range plan.keyStale {
		rep.Repairs = append(rep.Repairs, g.name()+": stale key index beside the active segment")
	}
	for _, name := range plan.orphans {
		rep.Repairs = append(rep.Repairs, name+": index file without a log")
	}
	sort.Strings(rep.Repairs)
	sort.Strings(rep.Damaged)
	return rep, nil
}

// isMissingReason tells an index file that is merely missing or stale
// (the active segment's are written at roll and Close only, and a crash
// in a rewrite leaves an old key index behind) from one that is there and
// malformed.
func isMissingReason(reason string) bool {
	return strings.Contains(reason, "missing") || strings.Contains(reason, "stale")
}
