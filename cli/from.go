package cli

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// startPos is where a read starts: the range's first retained record, its
// tail, an offset, or the first record appended at or after a time.
type startPos struct {
	end    bool
	offset uint64
	time   time.Time
}

// parseFrom reads --from: "start" (or "earliest"), "end" (or "latest"), an
// offset, a time before now ("-1h", "-90s", or "1h" meaning as much ago), or
// an RFC 3339 time. Errors are in plain words, never a Go time layout.
func parseFrom(s string, now time.Time) (startPos, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "start", "earliest", "beginning":
		return startPos{}, nil
	case "end", "latest", "tail":
		return startPos{end: true}, nil
	}
	if n, err := strconv.ParseUint(s, 10, 64); err == nil {
		return startPos{offset: n}, nil
	}
	if d, err := time.ParseDuration(strings.TrimPrefix(s, "-")); err == nil {
		if d <= 0 {
			return startPos{}, fmt.Errorf("--from %s: a relative time must be a positive duration before now, such as -1h", s)
		}
		return startPos{time: now.Add(-d)}, nil
	}
	t, err := parseTime(s)
	if err != nil {
		return startPos{}, fmt.Errorf("--from %q is none of start, end, an offset, a time before now such as -1h or -30m, or a time such as 2026-12-01T15:04:05Z", s)
	}
	return startPos{time: t}, nil
}

// parseTime reads an RFC 3339 time (fractional seconds allowed), or a date
// and time without a zone as UTC ("2026-12-01 15:04:05", "2026-12-01").
func parseTime(s string) (time.Time, error) {
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04:05", "2006-01-02 15:04:05", "2006-01-02"} {
		if t, err := time.Parse(layout, s); err == nil {
			return t, nil
		}
	}
	return time.Time{}, fmt.Errorf("%q is not a time such as 2026-12-01T15:04:05Z (RFC 3339)", s)
}
