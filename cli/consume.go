package cli

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"sync"
	"text/template"
	"time"
	"unicode/utf8"

	"github.com/geolog/geolog/client"
	"github.com/geolog/geolog/keyspace"
)

// consumeOpts are the consume command's settings.
type consumeOpts struct {
	stream     string
	ranges     []uint32
	fromOffset uint64
	fromTime   time.Time
	// fromEnd starts at each range's tail when the command starts.
	fromEnd bool
	follow  bool
	max     int64 // 0: no bound
	json    bool
	// byKey reads only the records of key (--key).
	byKey bool
	key   []byte
}

func (e *env) consume(ctx context.Context, args []string) error {
	fs := e.flagSet("consume")
	rng := fs.Int("range", -1, "read only this range (default: all ranges)")
	fromOffset := fs.Uint64("from-offset", 0, "start at this offset (in every range read)")
	fromTime := fs.String("from-time", "", "start at the first record appended at or after this time (RFC 3339, or before now: -1h)")
	from := fs.String("from", "", "where to start: start (default), end, an offset, a time before now (-1h, -30m) or an RFC 3339 time")
	follow := fs.Bool("follow", false, "keep following the tail until interrupted")
	maxRecords := fs.Int64("max", 0, "stop after this many records (0: no bound)")
	output := outputFlags(fs, "print one JSON object per record")
	key := fs.String("key", "", "read only the records of this key (one conversation), through the key index; its range unless --range; --key '' reads the keyless records")
	g := groupFlags(fs) // groups.go
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if err := output.check(); err != nil {
		return err
	}
	asJSON := output.asJSON
	if len(pos) != 1 {
		return usagef("usage: consume <stream> [--range N] [--key K] [--from start|end|N|-1h|RFC3339] [--follow] [--max N] [--json]\n       consume <stream> --group G [--start earliest|latest] [--member ID] [--instance ID] [--session D] [--max N] [--json]")
	}
	if g.group != "" {
		if *rng >= 0 || isSet(fs, "from-offset") || *fromTime != "" || isSet(fs, "from") || isSet(fs, "key") {
			return usagef("--group takes its positions from the group: no --range, --key, --from, --from-offset or --from-time")
		}
		return e.consumeGroup(ctx, pos[0], g, &recordPrinter{w: e.stdout, json: *asJSON, tmpl: output.tmpl, max: *maxRecords})
	}
	o := consumeOpts{stream: pos[0], fromOffset: *fromOffset, follow: *follow, max: *maxRecords, json: *asJSON,
		byKey: isSet(fs, "key"), key: []byte(*key)}
	if isSet(fs, "range") && *rng < 0 {
		return usagef("--range must be a range number (0 or more); leave it out to read every range")
	}
	starts := 0
	for _, name := range []string{"from", "from-offset", "from-time"} {
		if isSet(fs, name) {
			starts++
		}
	}
	if starts > 1 {
		return usagef("--from, --from-offset and --from-time exclude each other")
	}
	if *fromTime != "" {
		// --from-time is --from with a time only.
		if _, err := parseTime(*fromTime); err != nil && !strings.HasPrefix(*fromTime, "-") {
			return usagef("--from-time: %v, or a time before now such as -1h", err)
		}
		*from = *fromTime
	}
	if *from != "" {
		sp, err := parseFrom(*from, time.Now())
		if err != nil {
			return usagef("%v", err)
		}
		o.fromOffset, o.fromTime, o.fromEnd = sp.offset, sp.time, sp.end
	}
	if o.max < 0 {
		return usagef("--max must not be negative")
	}

	c, err := e.client()
	if err != nil {
		return err
	}
	defer c.Close()
	d, err := c.DescribeStream(ctx, o.stream)
	if err != nil {
		return err
	}
	if o.ranges, err = consumeRanges(o, *rng, d.Stream.RangeCount); err != nil {
		return err
	}
	if len(o.ranges) == 0 {
		for r := range d.Stream.RangeCount {
			o.ranges = append(o.ranges, r)
		}
	}
	pr := &recordPrinter{w: e.stdout, json: o.json, tmpl: output.tmpl, max: o.max}
	if o.follow {
		return e.consumeFollow(ctx, c, o, pr)
	}
	tails := make(map[uint32]uint64)
	for _, r := range d.Ranges {
		tails[r.Range] = r.TailOffset
	}
	for _, r := range o.ranges {
		done, err := e.consumeRange(ctx, c, o, r, tails[r], pr)
		if err != nil {
			return err
		}
		if done {
			break
		}
	}
	return nil
}

// consumeRanges returns the ranges consume reads: rng if it is not -1;
// else, with a non-empty --key, the key's range; else none (every range).
// A key of another range than rng is refused.
func consumeRanges(o consumeOpts, rng int, rangeCount uint32) ([]uint32, error) {
	keyed := o.byKey && len(o.key) > 0
	switch {
	case rng >= 0 && uint32(rng) >= rangeCount:
		return nil, usagef("stream %s has ranges 0..%d", o.stream, rangeCount-1)
	case rng >= 0 && keyed && keyspace.RangeForKey(o.key, rangeCount) != uint32(rng):
		return nil, usagef("key %q is in range %d of stream %s, not %d", o.key, keyspace.RangeForKey(o.key, rangeCount), o.stream, rng)
	case rng >= 0:
		return []uint32{uint32(rng)}, nil
	case keyed:
		return []uint32{keyspace.RangeForKey(o.key, rangeCount)}, nil
	}
	return nil, nil
}

func isSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// startOffset resolves where reading range r starts, moving up to the
// range's first retained offset if the requested one is gone.
func (e *env) startOffset(ctx context.Context, c *client.Client, o consumeOpts, r uint32) (uint64, error) {
	from := o.fromOffset
	if !o.fromTime.IsZero() {
		return c.OffsetForTime(ctx, o.stream, r, o.fromTime)
	}
	if o.fromEnd {
		res, err := c.Read(ctx, o.stream, r, 0, client.ReadOptions{MaxRecords: 1})
		var ae *client.Error
		switch {
		case errors.As(err, &ae) && ae.Code == client.CodeOffsetOutOfRange:
			return ae.TailOffset, nil // offset 0 is no longer retained
		case err != nil:
			return 0, err
		}
		return res.TailOffset, nil
	}
	_, err := c.Read(ctx, o.stream, r, from, client.ReadOptions{MaxRecords: 1})
	var ae *client.Error
	if errors.As(err, &ae) && ae.Code == client.CodeOffsetOutOfRange && from < ae.StartOffset {
		fmt.Fprintf(e.stderr, "range %d: offset %d is no longer retained; starting at %d\n", r, from, ae.StartOffset)
		return ae.StartOffset, nil
	}
	return from, err
}

// consumeRange prints range r from the start up to tail (the tail when the
// command started). It reports whether --max was reached.
func (e *env) consumeRange(ctx context.Context, c *client.Client, o consumeOpts, r uint32, tail uint64, pr *recordPrinter) (bool, error) {
	next, err := e.startOffset(ctx, c, o, r)
	if err != nil {
		return false, err
	}
	for next < tail {
		res, err := c.Read(ctx, o.stream, r, next, client.ReadOptions{ByKey: o.byKey, Key: o.key})
		if err != nil {
			return false, err
		}
		if len(res.Records) == 0 && res.NextOffset <= next {
			break // the range is shorter than described (retention or a racing truncation)
		}
		for _, rec := range res.Records {
			if rec.Offset >= tail {
				return false, nil
			}
			if !pr.print(rec) {
				return true, nil
			}
		}
		next = res.NextOffset
	}
	return false, nil
}

// consumeFollow subscribes to every range and prints until ctx ends, --max
// is reached, or a subscription fails.
func (e *env) consumeFollow(ctx context.Context, c *client.Client, o consumeOpts, pr *recordPrinter) error {
	// outer is the caller's context, taken before it is wrapped: the wrapped
	// one is cancelled by the first failing range, and a failure must not be
	// mistaken for the caller's interrupt (a follow whose node died once
	// exited 0 without a word).
	outer := ctx
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, len(o.ranges))
	var wg sync.WaitGroup
	for _, r := range o.ranges {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := client.StartAt{Time: o.fromTime}
			if o.fromTime.IsZero() {
				from, err := e.startOffset(ctx, c, o, r)
				if err != nil {
					errs <- err
					cancel()
					return
				}
				start.Offset = from
			}
			records := c.Subscribe(ctx, o.stream, r, start)
			if o.byKey {
				records = c.SubscribeKey(ctx, o.stream, r, o.key, start)
			}
			for rec, err := range records {
				if err != nil {
					if ctx.Err() == nil {
						errs <- err
						cancel()
					}
					return
				}
				if !pr.print(rec) {
					cancel()
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil && outer.Err() == nil {
		return err
	}
	return nil
}

// recordPrinter prints consumed records, tab-separated
// (range, offset, key, value) or as JSON lines, up to max.
type recordPrinter struct {
	w    io.Writer
	json bool
	// tmpl, if not nil, prints each record's JSON form through it (--format).
	tmpl *template.Template
	max  int64

	mu      sync.Mutex
	printed int64
}

// recordJSON is the --json form of a record. Key and value are strings when
// they are valid UTF-8, else base64 in key_b64 / value_b64.
type recordJSON struct {
	Range        uint32            `json:"range"`
	Offset       uint64            `json:"offset"`
	Key          *string           `json:"key,omitempty"`
	KeyB64       string            `json:"key_b64,omitempty"`
	Value        *string           `json:"value,omitempty"`
	ValueB64     string            `json:"value_b64,omitempty"`
	Headers      map[string]string `json:"headers,omitempty"`
	AppendTime   string            `json:"append_time,omitempty"`
	ProducerTime string            `json:"producer_time,omitempty"`
	Epoch        uint64            `json:"epoch"`
	// Tombstone: a deletion of key (a compacted stream's), no value.
	Tombstone bool `json:"tombstone,omitempty"`
}

// print prints rec; false once max records have been printed.
func (p *recordPrinter) print(rec client.StoredRecord) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.max > 0 && p.printed >= p.max {
		return false
	}
	p.printed++
	if p.json || p.tmpl != nil {
		j := recordJSON{Range: rec.Range, Offset: rec.Offset, Epoch: rec.Epoch, Tombstone: rec.Tombstone}
		if len(rec.Key) > 0 {
			if utf8.Valid(rec.Key) {
				s := string(rec.Key)
				j.Key = &s
			} else {
				j.KeyB64 = base64.StdEncoding.EncodeToString(rec.Key)
			}
		}
		switch {
		case rec.Tombstone:
		case utf8.Valid(rec.Value):
			s := string(rec.Value)
			j.Value = &s
		default:
			j.ValueB64 = base64.StdEncoding.EncodeToString(rec.Value)
		}
		if len(rec.Headers) > 0 {
			j.Headers = make(map[string]string, len(rec.Headers))
			for _, h := range rec.Headers {
				j.Headers[h.Key] = string(h.Value)
			}
		}
		if !rec.AppendTime.IsZero() {
			j.AppendTime = rec.AppendTime.UTC().Format(time.RFC3339Nano)
		}
		if !rec.ProducerTime.IsZero() {
			j.ProducerTime = rec.ProducerTime.UTC().Format(time.RFC3339Nano)
		}
		if p.tmpl != nil {
			if err := (&output{tmpl: p.tmpl}).write(p.w, j); err != nil {
				fmt.Fprintf(p.w, "%v\n", err)
			}
			return true
		}
		b, _ := json.Marshal(j)
		fmt.Fprintf(p.w, "%s\n", b)
	} else if rec.Tombstone {
		fmt.Fprintf(p.w, "%d\t%d\t%s\t(tombstone)\n", rec.Range, rec.Offset, rec.Key)
	} else {
		fmt.Fprintf(p.w, "%d\t%d\t%s\t%s\n", rec.Range, rec.Offset, rec.Key, rec.Value)
	}
	return p.max == 0 || p.printed < p.max
}
