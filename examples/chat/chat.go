package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/geolog/geolog/client"
)

// The record format of a chat message: the key is the conversation, the
// value the text, and two headers say who sent it and its message id.
const (
	headerID   = "chat-id"
	headerFrom = "chat-from"
)

// Bounds.
const (
	// idBytesMax bounds a message id (they are kept in cursor metadata).
	idBytesMax = 64
	// seenBytesMax is the cursor metadata bound of the server: the ids of
	// the newest acknowledged messages that fit in it are kept there.
	seenBytesMax = 1024
	// readRecordsMax is the records asked for per Read.
	readRecordsMax = 1000
)

// App is the chat logic on the public SDK: send, sync and ack for one
// stream whose keys are conversations.
type App struct {
	c        *client.Client
	stream   string
	producer *client.Producer
}

// Message is one chat message as stored.
type Message struct {
	Conv, ID, From, Text string
	Range                uint32
	Offset               uint64
	Sent                 time.Time
}

// NewApp checks that stream exists. Close the app to stop its producer.
func NewApp(ctx context.Context, c *client.Client, stream string) (*App, error) {
	if _, err := c.DescribeStream(ctx, stream); err != nil {
		return nil, err
	}
	return &App{c: c, stream: stream}, nil
}

// Close stops the app's producer, if it made one.
func (a *App) Close() {
	if a.producer != nil {
		a.producer.Close()
	}
}

// NewMessageID returns a random message id (128 bits, hex). A device makes
// one per message it composes and keeps it until the send is acknowledged,
// so that a send retried after a crash or a timeout carries the same id.
func NewMessageID() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand does not fail on supported platforms
	}
	return hex.EncodeToString(b[:])
}

// checkName refuses names and ids that the record and cursor formats
// cannot carry: empty, too long, or with a byte that separates ids in
// cursor metadata.
func checkName(what, s string, bytesMax int) error {
	switch {
	case s == "":
		return fmt.Errorf("chat: empty %s", what)
	case len(s) > bytesMax:
		return fmt.Errorf("chat: %s of %d bytes (at most %d)", what, len(s), bytesMax)
	case strings.ContainsAny(s, "\n/"):
		return fmt.Errorf("chat: %s %q contains '/' or a newline", what, s)
	}
	return nil
}

// Send appends text to conversation conv from sender, under message id id
// (NewMessageID when empty), and returns where it landed. The SDK's
// idempotent producer makes its own retries (a lost ack, a leader change)
// land once; the id makes a retry by the application (the same id sent
// again after a crash) recognisable, and Sync delivers it once.
func (a *App) Send(ctx context.Context, conv, from, id, text string) (Message, error) {
	if id == "" {
		id = NewMessageID()
	}
	for _, c := range []struct{ what, s string }{{"conversation", conv}, {"sender", from}, {"message id", id}} {
		if err := checkName(c.what, c.s, idBytesMax); err != nil {
			return Message{}, err
		}
	}
	if a.producer == nil {
		p, err := a.c.NewProducer(a.stream)
		if err != nil {
			return Message{}, err
		}
		a.producer = p
	}
	rec := &client.Record{Key: []byte(conv), Value: []byte(text),
		Headers: []client.Header{{Key: headerID, Value: []byte(id)}, {Key: headerFrom, Value: []byte(from)}}}
	res, err := a.producer.ProduceSync(ctx, rec)
	if err != nil {
		return Message{}, err
	}
	return Message{Conv: conv, ID: id, From: from, Text: text, Range: res[0].Range, Offset: res[0].Offset,
		Sent: rec.ProducerTime}, nil
}

// messageOf decodes a stored record as a message; ok is false for records
// that are not chat messages (no key or no id).
func messageOf(r client.StoredRecord) (m Message, ok bool) {
	m = Message{Conv: string(r.Key), Text: string(r.Value), Range: r.Range, Offset: r.Offset, Sent: r.ProducerTime}
	for _, h := range r.Headers {
		switch h.Key {
		case headerID:
			m.ID = string(h.Value)
		case headerFrom:
			m.From = string(h.Value)
		}
	}
	return m, m.Conv != "" && m.ID != ""
}

// cursorName is the name of device's cursor for conv: its delivered/read
// receipt. One cursor per (device, conversation), each with one position
// (the conversation's range).
func cursorName(device, conv string) string { return "chat/" + device + "/" + conv }

// receipt is a device's receipt for one conversation: every message of it
// below Offset was delivered, and Seen holds the ids of the newest of them
// (to recognise a resent message whose first copy was acknowledged).
type receipt struct {
	Offset, Generation uint64
	Seen               []string
}

// seenOf decodes cursor metadata: ids separated by newlines. It is
// bounded by the server's metadata bound; anything malformed is skipped.
func seenOf(metadata []byte) []string {
	var out []string
	for _, id := range strings.Split(string(metadata), "\n") {
		if id != "" && len(id) <= idBytesMax {
			out = append(out, id)
		}
	}
	return out
}

// seenMetadata encodes the newest ids of seen that fit in seenBytesMax.
func seenMetadata(seen []string) []byte {
	n, size := len(seen), 0
	for n > 0 && size+len(seen[n-1])+1 <= seenBytesMax {
		size += len(seen[n-1]) + 1
		n--
	}
	return []byte(strings.Join(seen[n:], "\n"))
}

// receipt reads device's receipt for conv, whose range is rng, from the
// coordinator's view (ConsistencyHome: an ack from another region is
// seen).
func (a *App) receipt(ctx context.Context, device, conv string, rng uint32) (receipt, error) {
	ps, err := a.c.GetCursors(ctx, cursorName(device, conv), a.stream, client.ConsistencyHome)
	if err != nil {
		return receipt{}, err
	}
	for _, p := range ps {
		if p.Range == rng {
			return receipt{Offset: p.Offset, Generation: p.Generation, Seen: seenOf(p.Metadata)}, nil
		}
	}
	return receipt{}, nil
}

// scan calls fn with every message of conversation conv (range rng) in
// [from, to), read by key: the range's key index on the server makes it
// cost about the conversation's records, not the range's. It reads from
// the nearest node once that has from (ConsistencyMinOffset). to == 0
// means the range's tail at the first read. It returns the end it
// scanned to. Records below the range's retained start are gone; it
// starts there.
func (a *App) scan(ctx context.Context, conv string, rng uint32, from, to uint64, fn func(client.StoredRecord)) (uint64, error) {
	for {
		res, err := a.c.Read(ctx, a.stream, rng, from, client.ReadOptions{MaxRecords: readRecordsMax,
			Consistency: client.ConsistencyMinOffset, MinOffset: from, ByKey: true, Key: []byte(conv)})
		var e *client.Error
		if errors.As(err, &e) && e.Code == client.CodeOffsetOutOfRange && from < e.StartOffset {
			from = e.StartOffset
			continue
		}
		if err != nil {
			return 0, err
		}
		if to == 0 {
			to = res.TailOffset
		}
		for _, r := range res.Records {
			if r.Offset >= to {
				return to, nil
			}
			fn(r)
		}
		if res.NextOffset >= to || res.NextOffset <= from {
			return max(to, from), nil
		}
		from = res.NextOffset
	}
}

// SyncResult is what a device has not acknowledged yet.
type SyncResult struct {
	// Messages are the new messages, by conversation (in the order asked)
	// and offset.
	Messages []Message
	// Next is, per conversation, the position to acknowledge once
	// Messages were delivered: the range's tail when it was read.
	Next map[string]uint64
	// Duplicates counts messages dropped because their id was delivered
	// before (a send retried by the application).
	Duplicates int
}

// Sync returns everything in convs that device has not acknowledged: the
// messages at or after each conversation's receipt, without those whose id
// was already delivered, each conversation read by key from its receipt.
func (a *App) Sync(ctx context.Context, device string, convs []string) (*SyncResult, error) {
	if err := checkName("device", device, idBytesMax); err != nil {
		return nil, err
	}
	out := &SyncResult{Next: map[string]uint64{}}
	for _, conv := range convs {
		if _, done := out.Next[conv]; done {
			continue // named twice
		}
		if err := a.syncConv(ctx, device, conv, out); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// syncConv adds conversation conv's part to out.
func (a *App) syncConv(ctx context.Context, device, conv string, out *SyncResult) error {
	if err := checkName("conversation", conv, idBytesMax); err != nil {
		return err
	}
	rng, err := a.c.RangeOfKey(ctx, a.stream, []byte(conv))
	if err != nil {
		return err
	}
	r, err := a.receipt(ctx, device, conv, rng)
	if err != nil {
		return err
	}
	seen := map[string]bool{}
	for _, id := range r.Seen {
		seen[id] = true
	}
	end, err := a.scan(ctx, conv, rng, r.Offset, 0, func(rec client.StoredRecord) {
		m, ok := messageOf(rec)
		switch {
		case !ok || m.Conv != conv:
		case seen[m.ID]:
			out.Duplicates++
		default:
			seen[m.ID] = true
			out.Messages = append(out.Messages, m)
		}
	})
	if err != nil {
		return err
	}
	out.Next[conv] = max(end, r.Offset)
	return nil
}

// Ack commits device's receipt for conv at offset upto (every message of
// conv below it was delivered); upto == 0 acknowledges up to the range's
// current tail. The receipt's metadata keeps the ids of the newest
// messages it covers, so that a later resend of one is not delivered
// again. A receipt never moves back: acknowledging below it changes
// nothing (applied false).
func (a *App) Ack(ctx context.Context, device, conv string, upto uint64) (at uint64, applied bool, err error) {
	if err := checkName("device", device, idBytesMax); err != nil {
		return 0, false, err
	}
	if err := checkName("conversation", conv, idBytesMax); err != nil {
		return 0, false, err
	}
	rng, err := a.c.RangeOfKey(ctx, a.stream, []byte(conv))
	if err != nil {
		return 0, false, err
	}
	r, err := a.receipt(ctx, device, conv, rng)
	if err != nil {
		return 0, false, err
	}
	if upto != 0 && upto <= r.Offset {
		return r.Offset, false, nil
	}
	seen, epoch := r.Seen, uint64(0)
	end, err := a.scan(ctx, conv, rng, r.Offset, upto, func(rec client.StoredRecord) {
		if m, ok := messageOf(rec); ok && m.Conv == conv && !slices.Contains(seen, m.ID) {
			seen = append(seen, m.ID)
		}
		if rec.Offset+1 == upto {
			epoch = rec.Epoch
		}
	})
	if err != nil {
		return 0, false, err
	}
	if end <= r.Offset {
		return r.Offset, false, nil
	}
	pos := client.CursorPosition{Stream: a.stream, Range: rng, Offset: end, Epoch: epoch,
		Generation: r.Generation, Metadata: seenMetadata(seen)}
	res, err := a.c.CommitCursors(ctx, cursorName(device, conv), pos)
	if err != nil {
		return 0, false, err
	}
	return res[0].Position.Offset, res[0].Applied, nil
}
