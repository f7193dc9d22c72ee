package cli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/geolog/geolog/client"
)

func (e *env) produce(ctx context.Context, args []string) error {
	fs := e.flagSet("produce")
	key := fs.String("key", "", "key for every record")
	keyField := fs.String("key-field", "", "input lines are JSON objects; the key is this field's value")
	tab := fs.Bool("tab", false, "input lines are key<TAB>value")
	tombstones := fs.Bool("tombstones", false, "with --tab: a line holding a key alone (no TAB) is a tombstone, a deletion of the key")
	var values, headers stringList
	fs.Var(&values, "value", "produce this value instead of reading stdin (repeatable)")
	fs.Var(&headers, "header", "add header k=v to every record (repeatable)")
	linger := fs.Duration("linger", 0, "producer linger")
	verbose := fs.Bool("v", false, "print range and offset of every record, in input order")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("usage: produce <stream> [--key K | --key-field F | --tab [--tombstones]] [--value V]... [--header k=v]... [-v]")
	}
	if *tombstones && !*tab {
		return usagef("--tombstones needs --tab")
	}
	modes := 0
	for _, set := range []bool{*key != "", *keyField != "", *tab} {
		if set {
			modes++
		}
	}
	if modes > 1 {
		return usagef("--key, --key-field and --tab exclude each other")
	}
	if len(values) > 0 && (*keyField != "" || *tab) {
		return usagef("--value takes its key from --key only")
	}
	var hdrs []client.Header
	for _, h := range headers {
		k, v, ok := strings.Cut(h, "=")
		if !ok || k == "" {
			return usagef("--header %q: want k=v", h)
		}
		hdrs = append(hdrs, client.Header{Key: k, Value: []byte(v)})
	}
	toRecord := func(line []byte) (*client.Record, error) {
		rec := &client.Record{Value: line, Headers: hdrs}
		switch {
		case *key != "":
			rec.Key = []byte(*key)
		case *tab:
			k, v, ok := bytes.Cut(line, []byte("\t"))
			switch {
			case !ok && *tombstones:
				rec.Key, rec.Value, rec.Tombstone = line, nil, true
				return rec, nil
			case !ok:
				return nil, errors.New("no TAB between key and value")
			}
			rec.Key, rec.Value = k, v
		case *keyField != "":
			var obj map[string]json.RawMessage
			if err := json.Unmarshal(line, &obj); err != nil {
				return nil, fmt.Errorf("not a JSON object: %v", err)
			}
			raw, ok := obj[*keyField]
			if !ok {
				return nil, fmt.Errorf("no field %q", *keyField)
			}
			var s string
			if json.Unmarshal(raw, &s) == nil {
				rec.Key = []byte(s)
			} else {
				rec.Key = bytes.TrimSpace(raw) // a number, bool or object: its JSON text
			}
		}
		return rec, nil
	}

	c, err := e.client()
	if err != nil {
		return err
	}
	defer c.Close()
	p, err := c.NewProducer(pos[0], client.Linger(*linger))
	if err != nil {
		return err
	}
	defer p.Close()

	out := &orderedPrinter{w: e.stdout, verbose: *verbose, done: make(map[int]string), hint: e.errorHint}
	n := 0
	produceOne := func(line []byte) error {
		rec, err := toRecord(line)
		if err != nil {
			return usagef("input line %d: %v", n+1, err)
		}
		i := n
		n++
		p.Produce(ctx, rec, func(res client.ProduceResult, err error) { out.result(i, res, err) })
		return nil
	}

	var inputErr error
	if len(values) > 0 {
		for _, v := range values {
			if inputErr = produceOne([]byte(v)); inputErr != nil {
				break
			}
		}
	} else {
		inputErr = readLines(ctx, e.stdin, produceOne)
	}
	// Deliver what was produced even if the input was bad or ctx ended; after
	// an interrupt, for a bounded time only.
	flushTimeout := 2*time.Minute + 10*time.Second
	if ctx.Err() != nil {
		flushTimeout = 10 * time.Second
	}
	fctx, cancel := context.WithTimeout(context.Background(), flushTimeout)
	defer cancel()
	if err := p.Flush(fctx); err != nil {
		return fmt.Errorf("flush: %w", err)
	}
	failed := out.summary(e.stderr, n)
	if errors.Is(inputErr, errInterrupted) {
		return fmt.Errorf("%w after %d records read from stdin (those were sent; failures are listed above)", inputErr, n)
	}
	if inputErr != nil {
		return inputErr
	}
	if failed > 0 {
		return errReported
	}
	return nil
}

// errInterrupted: the input was cut short by the caller's interrupt.
var errInterrupted = errors.New("interrupted")

// readLines calls each with every line of r (without its line ending) until
// r ends, each fails, or ctx ends. r is read on a goroutine of its own, since
// a read of a terminal or a pipe cannot be interrupted: on ctx's end
// readLines returns at once (errInterrupted) and leaves that goroutine
// blocked in its read until the process exits. At most one line is read
// ahead of each.
func readLines(ctx context.Context, r io.Reader, each func([]byte) error) error {
	type line struct {
		b   []byte
		err error
	}
	lines := make(chan line)
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		br := bufio.NewReaderSize(r, 64<<10)
		for {
			b, err := br.ReadBytes('\n')
			select {
			case lines <- line{b, err}:
			case <-stop:
				return
			}
			if err != nil {
				return
			}
		}
	}()
	for {
		var l line
		select {
		case <-ctx.Done():
			return errInterrupted
		case l = <-lines:
		}
		if len(l.b) > 0 {
			b := bytes.TrimSuffix(bytes.TrimSuffix(l.b, []byte("\n")), []byte("\r"))
			if err := each(b); err != nil {
				return err
			}
		}
		if l.err == io.EOF {
			return nil
		}
		if l.err != nil {
			return fmt.Errorf("reading stdin: %w", l.err)
		}
	}
}

// orderedPrinter prints produce results in input order although callbacks
// of different ranges complete in any order.
type orderedPrinter struct {
	w       io.Writer
	verbose bool
	// hint gives what to do next after a failure (env.errorHint).
	hint func(error) string

	mu     sync.Mutex
	next   int
	done   map[int]string
	errs   []string
	hints  []string // distinct, in order of first failure
	failed int
}

func (o *orderedPrinter) result(i int, res client.ProduceResult, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if err != nil {
		o.failed++
		if len(o.errs) < 10 {
			o.errs = append(o.errs, fmt.Sprintf("record %d: %v", i+1, err))
		}
		if o.hint != nil {
			if h := o.hint(err); h != "" && !slices.Contains(o.hints, h) {
				o.hints = append(o.hints, h)
			}
		}
		o.done[i] = fmt.Sprintf("error\t%v", err)
	} else {
		dup := ""
		if res.Duplicate {
			dup = "\tduplicate"
		}
		o.done[i] = fmt.Sprintf("%d\t%d%s", res.Range, res.Offset, dup)
	}
	for {
		line, ok := o.done[o.next]
		if !ok {
			return
		}
		delete(o.done, o.next)
		o.next++
		if o.verbose {
			fmt.Fprintln(o.w, line)
		}
	}
}

// summary reports failures on w and returns their count.
func (o *orderedPrinter) summary(w io.Writer, total int) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, e := range o.errs {
		fmt.Fprintln(w, e)
	}
	if o.failed > 0 {
		fmt.Fprintf(w, "%d of %d records failed\n", o.failed, total)
		for _, h := range o.hints {
			fmt.Fprintf(w, "(%s)\n", h)
		}
	} else if o.verbose {
		fmt.Fprintf(w, "produced %d records\n", total)
	}
	return o.failed
}
