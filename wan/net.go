package wan

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
)

// Net holds many named links, e.g. one per (client region, server) pair of
// a local multi-region cluster, and breaks them by region. Safe for
// concurrent use.
type Net struct {
	logger hclog.Logger

	mu     sync.Mutex
	links  map[string]*Link
	closed bool
}

// NewNet returns an empty Net. logger defaults to a null logger; links
// added without a Logger of their own log through it.
func NewNet(logger hclog.Logger) *Net {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	return &Net{logger: logger, links: make(map[string]*Link)}
}

// Add starts a link from cfg and adds it under its name. ErrLinkExists if
// the name is taken, a *ConfigError for a bad cfg, ErrClosed after Close.
func (n *Net) Add(cfg Config) (*Link, error) {
	if cfg.Logger == nil {
		cfg.Logger = n.logger
	}
	// Validate first so that a derived name is checked for duplicates.
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil, ErrClosed
	}
	if _, ok := n.links[cfg.Name]; ok {
		n.mu.Unlock()
		return nil, fmt.Errorf("%w: %q", ErrLinkExists, cfg.Name)
	}
	// Reserve the name while listening, without holding the lock.
	n.links[cfg.Name] = nil
	n.mu.Unlock()

	l, err := NewLink(cfg)

	n.mu.Lock()
	defer n.mu.Unlock()
	if err != nil || n.closed {
		delete(n.links, cfg.Name)
		if err == nil {
			_ = l.Close()
			err = ErrClosed
		}
		return nil, err
	}
	n.links[cfg.Name] = l
	return l, nil
}

// Link returns the link of that name, or ErrUnknownLink.
func (n *Net) Link(name string) (*Link, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if l := n.links[name]; l != nil {
		return l, nil
	}
	return nil, fmt.Errorf("%w: %q", ErrUnknownLink, name)
}

// Links returns the links, sorted by name.
func (n *Net) Links() []*Link {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.sortedLocked(func(*Link) bool { return true })
}

func (n *Net) sortedLocked(keep func(*Link) bool) []*Link {
	out := make([]*Link, 0, len(n.links))
	for _, l := range n.links {
		if l != nil && keep(l) {
			out = append(out, l)
		}
	}
	slices.SortFunc(out, func(a, b *Link) int {
		switch {
		case a.Name() < b.Name():
			return -1
		case a.Name() > b.Name():
			return 1
		}
		return 0
	})
	return out
}

func (n *Net) selectLinks(keep func(*Link) bool) []*Link {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.sortedLocked(keep)
}

// Remove closes the named link and forgets it. ErrUnknownLink if absent.
func (n *Net) Remove(name string) error {
	n.mu.Lock()
	l := n.links[name]
	if l == nil {
		n.mu.Unlock()
		return fmt.Errorf("%w: %q", ErrUnknownLink, name)
	}
	delete(n.links, name)
	n.mu.Unlock()
	return l.Close()
}

// Stats returns every link's stats, sorted by name.
func (n *Net) Stats() []Stats {
	links := n.Links()
	out := make([]Stats, len(links))
	for i, l := range links {
		out[i] = l.Stats()
	}
	return out
}

// CutRegion cuts every link from or to region (its From or To), isolating
// the region, and returns the links cut. A region that names no link is
// ErrUnknownLink, so that a typo does not pass for a partition.
func (n *Net) CutRegion(region string, mode CutMode) ([]*Link, error) {
	return n.apply(n.selectLinks(func(l *Link) bool { return l.From() == region || l.To() == region }),
		fmt.Sprintf("region %q", region), func(l *Link) error { return l.Cut(mode) })
}

// HealRegion heals every link from or to region.
func (n *Net) HealRegion(region string) ([]*Link, error) {
	return n.apply(n.selectLinks(func(l *Link) bool { return l.From() == region || l.To() == region }),
		fmt.Sprintf("region %q", region), (*Link).Heal)
}

// Partition cuts the links between regions a and b, both ways (From a To b,
// and From b To a), and returns them.
func (n *Net) Partition(a, b string, mode CutMode) ([]*Link, error) {
	return n.apply(n.between(a, b), fmt.Sprintf("regions %q and %q", a, b), func(l *Link) error { return l.Cut(mode) })
}

// HealBetween heals the links between regions a and b, both ways.
func (n *Net) HealBetween(a, b string) ([]*Link, error) {
	return n.apply(n.between(a, b), fmt.Sprintf("regions %q and %q", a, b), (*Link).Heal)
}

// SetLatencyBetween sets the latency and jitter of the links between
// regions a and b, both ways.
func (n *Net) SetLatencyBetween(a, b string, latency, jitter time.Duration) ([]*Link, error) {
	if err := checkLatency(latency, jitter); err != nil {
		return nil, fmt.Errorf("%w: %s", ErrInvalidArgument, err)
	}
	return n.apply(n.between(a, b), fmt.Sprintf("regions %q and %q", a, b),
		func(l *Link) error { return l.SetLatency(latency, jitter) })
}

// HealAll heals every link.
func (n *Net) HealAll() error {
	var errs []error
	for _, l := range n.Links() {
		if err := l.Heal(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (n *Net) between(a, b string) []*Link {
	return n.selectLinks(func(l *Link) bool {
		return l.From() == a && l.To() == b || l.From() == b && l.To() == a
	})
}

func (n *Net) apply(links []*Link, what string, f func(*Link) error) ([]*Link, error) {
	if len(links) == 0 {
		return nil, fmt.Errorf("%w: no link joins %s", ErrUnknownLink, what)
	}
	var errs []error
	for _, l := range links {
		if err := f(l); err != nil {
			errs = append(errs, err)
		}
	}
	return links, errors.Join(errs...)
}

// Close closes every link. Later calls return ErrClosed.
func (n *Net) Close() error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return ErrClosed
	}
	n.closed = true
	links := n.sortedLocked(func(*Link) bool { return true })
	n.links = make(map[string]*Link)
	n.mu.Unlock()
	var errs []error
	for _, l := range links {
		if err := l.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
