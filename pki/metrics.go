package pki

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// ExpiryMetric is the gauge RegisterMetrics reports: seconds left before
// a certificate in use expires (negative once it has), by "certificate"
// ("leaf": this party's own; "ca": the soonest to expire of the bundle
// it trusts) and "identity".
const ExpiryMetric = "geolog.tls.certificate.expiry"

// RegisterMetrics reports ExpiryMetric on mp at every collection, from
// the material in use then, so a reload shows at the next scrape and
// monitoring can warn ahead of an expiry (the logs say it only at load).
func (f *Files) RegisterMetrics(mp metric.MeterProvider) error {
	if mp == nil {
		return nil
	}
	g, err := mp.Meter("github.com/geolog/geolog/pki").Float64ObservableGauge(ExpiryMetric,
		metric.WithUnit("s"), metric.WithDescription("seconds left before a TLS certificate in use expires"))
	if err != nil {
		return fmt.Errorf("pki: metrics: %w", err)
	}
	_, err = mp.Meter("github.com/geolog/geolog/pki").RegisterCallback(func(_ context.Context, o metric.Observer) error {
		leaf, ca := f.Expiry()
		now := f.cfg.Now()
		who := attribute.String("identity", f.Identity().Name())
		o.ObserveFloat64(g, leaf.Sub(now).Seconds(), metric.WithAttributes(attribute.String("certificate", "leaf"), who))
		if !ca.IsZero() {
			o.ObserveFloat64(g, ca.Sub(now).Seconds(), metric.WithAttributes(attribute.String("certificate", "ca"), who))
		}
		return nil
	}, g)
	if err != nil {
		return fmt.Errorf("pki: metrics: %w", err)
	}
	return nil
}

// Expiry returns when the certificate in use expires, and when the first
// certificate of the CA bundle in use does (zero if none parses).
func (f *Files) Expiry() (leaf, ca time.Time) {
	m := f.cur.Load()
	return m.cert.Leaf.NotAfter, m.caNotAfter
}

// soonestNotAfter is the earliest end of validity of the certificates in
// a PEM bundle (zero if none parses).
func soonestNotAfter(bundle []byte) time.Time {
	var soonest time.Time
	for {
		var b *pem.Block
		b, bundle = pem.Decode(bundle)
		if b == nil {
			return soonest
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			continue
		}
		if soonest.IsZero() || c.NotAfter.Before(soonest) {
			soonest = c.NotAfter
		}
	}
}
