package apierr

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"testing"
)

// errSentinel stands for a core's sentinel that an API error wraps.
var errSentinel = errors.New("core: range is fenced")

// TestCauseSurvives: errors.Is and errors.As reach a cause through an
// *Error, and through a %w around it; the code matches by Is as before.
func TestCauseSurvives(t *testing.T) {
	pathErr := &fs.PathError{Op: "open", Path: "/data/r1", Err: fs.ErrNotExist}
	for _, c := range []struct {
		name  string
		err   error
		cause error
	}{
		{"sentinel", Wrap(Unavailable, errSentinel, "range %d", 3), errSentinel},
		{"wrapped twice", fmt.Errorf("append: %w", Wrap(NotHome, fmt.Errorf("lease: %w", errSentinel), "")), errSentinel},
		{"path error", Wrap(Corruption, pathErr, "segment"), fs.ErrNotExist},
		{"context", As(fmt.Errorf("wait: %w", context.Canceled)), context.Canceled},
	} {
		if !errors.Is(c.err, c.cause) {
			t.Errorf("%s: errors.Is(%v, %v) is false", c.name, c.err, c.cause)
		}
		var e *Error
		if !errors.As(c.err, &e) || e.Cause == nil {
			t.Errorf("%s: no *Error with a cause in %v", c.name, c.err)
		}
		if errors.Is(c.err, errors.New(c.cause.Error())) {
			t.Errorf("%s: matched an unrelated error of the same text", c.name)
		}
	}
	var pe *fs.PathError
	if !errors.As(Wrap(Corruption, pathErr, "segment"), &pe) || pe.Path != "/data/r1" {
		t.Fatal("errors.As must reach the cause's type")
	}
	if !errors.Is(fmt.Errorf("x: %w", New(StreamNotFound, "a")), New(StreamNotFound, "b")) {
		t.Fatal("errors.Is must match by code")
	}
	if errors.Is(New(StreamNotFound, "a"), New(StreamExists, "a")) {
		t.Fatal("errors.Is matched another code")
	}
}

func TestWrapMessage(t *testing.T) {
	for _, c := range []struct {
		err  *Error
		want string
	}{
		{Wrap(Unavailable, errSentinel, "range %d", 3), "range 3: core: range is fenced (UNAVAILABLE)"},
		{Wrap(Unavailable, errSentinel, ""), "core: range is fenced (UNAVAILABLE)"},
		{Wrap(Internal, nil, "plain"), "plain (INTERNAL)"},
		{As(context.DeadlineExceeded), "context deadline exceeded (TIMEOUT)"},
	} {
		if got := c.err.Error(); got != c.want {
			t.Errorf("got %q, want %q", got, c.want)
		}
	}
	if e := Wrap(NotLeader, errSentinel, "x"); !e.Retriable || e.Code != NotLeader {
		t.Fatalf("Wrap lost the catalogue's retriability: %+v", e)
	}
}

func TestAsAndCodeOf(t *testing.T) {
	for _, c := range []struct {
		err       error
		code      Code
		retriable bool
	}{
		{fmt.Errorf("w: %w", NewOverloaded(0, "busy")), Overloaded, true},
		{context.DeadlineExceeded, Timeout, true},
		{fmt.Errorf("w: %w", context.Canceled), Timeout, true},
		{errors.New("plain"), Internal, false},
	} {
		if CodeOf(c.err) != c.code || IsRetriable(c.err) != c.retriable {
			t.Errorf("%v: got %v retriable=%v", c.err, CodeOf(c.err), IsRetriable(c.err))
		}
		if e := As(c.err); e.Code != c.code || !errors.Is(e, c.err) && !errors.Is(c.err, e) {
			t.Errorf("%v: As gave %+v", c.err, e)
		}
	}
	if As(nil) != nil || CodeOf(nil) != unspecified || IsRetriable(nil) {
		t.Fatal("nil must stay nil")
	}
}

// TestNames: every code has a distinct name, and String is the proto
// enum's spelling.
func TestNames(t *testing.T) {
	seen := map[string]Code{}
	for _, c := range Codes() {
		n := ShortName(c)
		if prev, dup := seen[n]; dup || n == "" {
			t.Fatalf("%d and %d share the name %q", prev, c, n)
		}
		seen[n] = c
		if c.String() != "ERROR_CODE_"+n {
			t.Fatalf("%d: String %q, ShortName %q", c, c.String(), n)
		}
	}
	if StreamExists.String() != "ERROR_CODE_STREAM_EXISTS" || Code(0).String() != "ERROR_CODE_UNSPECIFIED" || Code(1000).String() != "1000" {
		t.Fatal("String differs from the proto enum's")
	}
}
