package wan

import (
	"errors"
	"fmt"
)

// ErrInvalidConfig is wrapped by every *ConfigError: a Config, a file
// config or a flag was refused. errors.Is(err, ErrInvalidConfig) holds.
var ErrInvalidConfig = errors.New("wan: invalid config")

// ErrInvalidArgument is returned for a bad argument at run time: an unknown
// cut mode, a latency or bandwidth out of bounds, a malformed control
// request.
var ErrInvalidArgument = errors.New("wan: invalid argument")

// ErrClosed is returned by a Link or Net that has been closed.
var ErrClosed = errors.New("wan: closed")

// ErrUnknownLink is returned when no link of a Net has the given name.
var ErrUnknownLink = errors.New("wan: unknown link")

// ErrLinkExists is returned when a Net already holds a link of that name.
var ErrLinkExists = errors.New("wan: link name already in use")

// ConfigError says which field of which link was refused and why. It
// matches ErrInvalidConfig under errors.Is.
type ConfigError struct {
	// Link is the link's name, empty when the error is not about one link.
	Link string
	// Field is the offending field, e.g. "Latency" or "links[2].upstream".
	Field string
	// Reason says what is wrong with it.
	Reason string
}

func (e *ConfigError) Error() string {
	if e.Link != "" {
		return fmt.Sprintf("wan: invalid config: link %q: %s: %s", e.Link, e.Field, e.Reason)
	}
	return fmt.Sprintf("wan: invalid config: %s: %s", e.Field, e.Reason)
}

// Is makes errors.Is(err, ErrInvalidConfig) hold.
func (e *ConfigError) Is(target error) bool { return target == ErrInvalidConfig }

func configErrorf(link, field, format string, args ...any) *ConfigError {
	return &ConfigError{Link: link, Field: field, Reason: fmt.Sprintf(format, args...)}
}
