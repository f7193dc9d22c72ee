package cli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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

	out := &orderedPrinter{w: e.stdout, verbose: *verbose, done: make(map[int]string)}
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
		r := bufio.NewReaderSize(e.stdin, 64<<10)
		for {
			line, err := r.ReadBytes('\n')
			if len(line) > 0 {
				line = bytes.TrimSuffix(bytes.TrimSuffix(line, []byte("\n")), []byte("\r"))
				if inputErr = produceOne(line); inputErr != nil {
					break
				}
			}
			if err == io.EOF {
				break
			}
			if err != nil {
				inputErr = fmt.Errorf("reading stdin: %w", err)
				break
			}
		}
	}
	// Deliver what was produced even if the input was bad or ctx ended.
	fctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute+10*time.Second)
	defer cancel()
	if err := p.Flush(fctx); err != nil {
		return fmt.Errorf("flush: %w", err)
	}
	failed := out.summary(e.stderr, n)
	if inputErr != nil {
		return inputErr
	}
	if failed > 0 {
		return errReported
	}
	return nil
}

// orderedPrinter prints produce results in input order although callbacks
// of different ranges complete in any order.
type orderedPrinter struct {
	w       io.Writer
	verbose bool

	mu     sync.Mutex
	next   int
	done   map[int]string
	errs   []string
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
	} else if o.verbose {
		fmt.Fprintf(w, "produced %d records\n", total)
	}
	return o.failed
}
