package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/geolog/geolog/atrest"
	"github.com/geolog/geolog/segment"
)

const verifyUsage = `usage (offline: on a node's data directory, the node stopped):
  verify --data-dir DIR [--kek-file FILE] [--json]
      check every range's log as the node would when it opens it, changing
      nothing: frame CRCs and order, segments that join up, the start that
      retention recorded (a missing oldest segment is data loss), index and
      key index files; with --kek-file (encryption at rest) sealed frames
      are opened with the node's data keys. One line per range; the exit
      status is 1 if any range has a problem`

// verifyLine is one range's result.
type verifyLine struct {
	Range         string   `json:"range"` // "meta" or "<stream>/<range>"
	Dir           string   `json:"dir"`
	OK            bool     `json:"ok"`
	Segments      int      `json:"segments"`
	Bytes         int64    `json:"bytes"`
	StartOffset   uint64   `json:"start_offset"`
	NextOffset    uint64   `json:"next_offset"`
	RecordedStart *uint64  `json:"recorded_start,omitempty"`
	TornTailBytes int64    `json:"torn_tail_bytes,omitempty"`
	PaddingBytes  int64    `json:"padding_bytes,omitempty"`
	Repairs       []string `json:"repairs,omitempty"`
	Damaged       []string `json:"damaged,omitempty"`
	Error         string   `json:"error,omitempty"`
	// Missing names the lost offsets [from, to) of a data loss (to <= from:
	// from there on).
	Missing *[2]uint64 `json:"missing,omitempty"`
}

// verify runs the offline check of a data directory (see verifyUsage).
func (e *env) verify(ctx context.Context, args []string) error {
	fs := e.flagSet("verify")
	dataDir := fs.String("data-dir", "", "the node's data directory")
	kekFile := fs.String("kek-file", "", "the KEK file (geologd --kek-file), if encryption at rest is on")
	asJSON := fs.Bool("json", false, "print as JSON")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 0 || *dataDir == "" {
		return usagef("%s", verifyUsage)
	}
	dirs, err := rangeDirs(*dataDir)
	if err != nil {
		return err
	}
	var keyring *atrest.Keyring
	if *kekFile != "" {
		kek, err := atrest.OpenKEKFile(*kekFile)
		if err != nil {
			return err
		}
		if keyring, err = atrest.Open(ctx, atrest.Config{Dir: atrest.NodeKeysDir(*dataDir), KEK: kek}); err != nil {
			return err
		}
		defer keyring.Close()
	}
	lines := make([]verifyLine, 0, len(dirs))
	bad := 0
	for _, d := range dirs {
		l := verifyRange(d, keyring)
		if !l.OK {
			bad++
		}
		lines = append(lines, l)
	}
	if err := e.printVerify(lines, *asJSON); err != nil {
		return err
	}
	if bad > 0 {
		fmt.Fprintf(e.stderr, "geolog verify: %d of %d ranges have problems\n", bad, len(lines))
		return errReported
	}
	return nil
}

// rangeDir is one range's directory and its name in the table.
type rangeDir struct{ name, dir string }

// rangeDirs lists a data directory's ranges: the catalogue (meta) and
// streams/<stream>/<range>, sorted.
func rangeDirs(dataDir string) ([]rangeDir, error) {
	if st, err := os.Stat(dataDir); err != nil {
		return nil, err
	} else if !st.IsDir() {
		return nil, fmt.Errorf("%s is not a directory", dataDir)
	}
	var out []rangeDir
	if st, err := os.Stat(filepath.Join(dataDir, "meta")); err == nil && st.IsDir() {
		out = append(out, rangeDir{"meta", filepath.Join(dataDir, "meta")})
	}
	streams, err := os.ReadDir(filepath.Join(dataDir, "streams"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	for _, s := range streams {
		if !s.IsDir() {
			continue
		}
		ranges, err := os.ReadDir(filepath.Join(dataDir, "streams", s.Name()))
		if err != nil {
			return nil, err
		}
		for _, r := range ranges {
			if r.IsDir() {
				out = append(out, rangeDir{s.Name() + "/" + r.Name(), filepath.Join(dataDir, "streams", s.Name(), r.Name())})
			}
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s holds no range (no meta/ or streams/*/*): is it a geologd data directory?", dataDir)
	}
	sort.Slice(out[1:], func(i, j int) bool { return out[1+i].name < out[1+j].name })
	return out, nil
}

// verifyRange checks one range's directory.
func verifyRange(d rangeDir, keyring *atrest.Keyring) verifyLine {
	l := verifyLine{Range: d.name, Dir: d.dir}
	rep, err := segment.Verify(segment.Config{Dir: d.dir, Keyring: keyring})
	if rep != nil {
		l.Segments, l.Bytes, l.StartOffset, l.NextOffset = rep.Segments, rep.Bytes, rep.StartOffset, rep.NextOffset
		if rep.RecordedStartOK {
			rs := rep.RecordedStart
			l.RecordedStart = &rs
		}
		l.TornTailBytes, l.PaddingBytes, l.Repairs, l.Damaged = rep.TornTailBytes, rep.PaddingBytes, rep.Repairs, rep.Damaged
		if rep.InstallPending {
			l.Repairs = append(l.Repairs, "an install (snapshot) committed and not rolled forward: the node completes it when it opens the range")
		}
	}
	var me *segment.MissingError
	switch {
	case err == nil:
	case errors.As(err, &me):
		l.Missing = &[2]uint64{me.FromOffset, me.ToOffset}
		l.Error = err.Error()
	case errors.Is(err, segment.ErrLocked):
		l.Error = "in use (is the node running? stop it first): " + err.Error()
	case errors.Is(err, atrest.ErrKeyUnavailable) && keyring == nil:
		l.Error = "sealed frames (encryption at rest): give --kek-file: " + err.Error()
	default:
		l.Error = err.Error()
	}
	l.OK = err == nil && len(l.Damaged) == 0
	return l
}

func (e *env) printVerify(lines []verifyLine, asJSON bool) error {
	if asJSON {
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(lines)
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RANGE\tSTATUS\tSEGMENTS\tBYTES\tSTART\tNEXT\tRECORDED START\tNOTES")
	for _, l := range lines {
		status := "ok"
		if !l.OK {
			status = "PROBLEM"
		}
		rec := "-"
		if l.RecordedStart != nil {
			rec = fmt.Sprint(*l.RecordedStart)
		}
		var notes []string
		if l.Error != "" {
			notes = append(notes, l.Error)
		}
		notes = append(notes, l.Damaged...)
		if l.TornTailBytes > 0 {
			notes = append(notes, fmt.Sprintf("torn tail of %d bytes (an interrupted write; cut off when the node opens the range)", l.TornTailBytes))
		}
		if l.PaddingBytes > 0 {
			notes = append(notes, fmt.Sprintf("%d bytes of zeros past the last frame (zero-ahead's, left by a crash; cut off when the node opens the range)", l.PaddingBytes))
		}
		if n := len(l.Repairs); n > 0 {
			notes = append(notes, fmt.Sprintf("%d index files to rebuild", n))
		}
		counts := fmt.Sprintf("%d\t%d\t%d\t%d", l.Segments, l.Bytes, l.StartOffset, l.NextOffset)
		if l.Error != "" && l.Segments == 0 {
			counts = "-\t-\t-\t-" // the check stopped before the pass
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", l.Range, status, counts, rec, strings.Join(notes, "; "))
	}
	return tw.Flush()
}
