// Command geolog-wan emulates WAN links on loopback: it runs many delaying
// TCP proxies (package wan) and an HTTP control API to cut, heal and slow
// them at run time.
//
//	geolog-wan --control 127.0.0.1:7600 \
//	    --link 'us-east->eu-west,127.0.0.1:17001,127.0.0.1:7411,40ms,2ms' \
//	    --link 'eu-west->us-east,127.0.0.1:17002,127.0.0.1:7401,40ms'
//	geolog-wan --config wan.json
//	curl -X POST '127.0.0.1:7600/regions/eu-west/cut?mode=blackhole'
//	curl -X POST '127.0.0.1:7600/heal'
//	curl 127.0.0.1:7600/links
//
// See wan.FileConfig for the file and wan.NewControlHandler for the API.
// SIGTERM or SIGINT closes everything and exits 0.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/geolog/geolog/wan"
	"github.com/hashicorp/go-hclog"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// linkFlags collects repeated --link values.
type linkFlags []string

func (l *linkFlags) String() string     { return strings.Join(*l, " ") }
func (l *linkFlags) Set(v string) error { *l = append(*l, v); return nil }

// run parses args, runs the links until ctx is done and returns the exit
// code: 0 after a clean shutdown, 2 for bad flags or config, 1 otherwise.
// Once ready it prints the control address and every link to stdout.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("geolog-wan", flag.ContinueOnError)
	fs.SetOutput(stderr)
	configPath := fs.String("config", "", "JSON config file (see wan.FileConfig); --link links are added to its links")
	control := fs.String("control", "", "control API listen address (default 127.0.0.1:0, or the file's)")
	var links linkFlags
	fs.Var(&links, "link", "a link as NAME,LISTEN,UPSTREAM[,LATENCY[,JITTER]] (repeatable); NAME of the form FROM->TO[.SUFFIX] sets its regions")
	latency := fs.String("latency", "", "default one-way latency of links that set none (default: 30-80ms per pair of regions, from --seed)")
	jitter := fs.String("jitter", "", "default jitter of links that set none (default 0)")
	seed := fs.Uint64("seed", 0, "seed of the jitter and default latencies (overrides the file's)")
	logLevel := fs.String("log-level", "info", "trace, debug, info, warn or error")
	logJSON := fs.Bool("log-json", false, "log as JSON")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "geolog-wan: unexpected arguments %q\n", fs.Args())
		return 2
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })

	var fc wan.FileConfig
	if *configPath != "" {
		data, err := os.ReadFile(*configPath)
		if err != nil {
			fmt.Fprintf(stderr, "geolog-wan: %v\n", err)
			return 2
		}
		if fc, err = wan.DecodeFileConfig(data); err != nil {
			fmt.Fprintf(stderr, "geolog-wan: %s: %v\n", *configPath, err)
			return 2
		}
	}
	if set["control"] {
		fc.Control = *control
	}
	if set["seed"] {
		fc.Seed = *seed
	}
	for name, text := range map[string]string{"latency": *latency, "jitter": *jitter} {
		if !set[name] {
			continue
		}
		d, err := time.ParseDuration(text)
		if err != nil {
			fmt.Fprintf(stderr, "geolog-wan: --%s: %v\n", name, err)
			return 2
		}
		wd := wan.Duration(d)
		if name == "latency" {
			fc.Latency = &wd
		} else {
			fc.Jitter = &wd
		}
	}
	for _, spec := range links {
		fl, err := parseLinkFlag(spec)
		if err != nil {
			fmt.Fprintf(stderr, "geolog-wan: --link %q: %v\n", spec, err)
			return 2
		}
		fc.Links = append(fc.Links, fl)
	}
	if len(fc.Links) == 0 {
		fmt.Fprintln(stderr, "geolog-wan: no links: give --config or --link")
		return 2
	}
	sc, err := fc.ServerConfig()
	if err != nil {
		fmt.Fprintf(stderr, "geolog-wan: %v\n", err)
		return 2
	}
	sc.Logger = hclog.New(&hclog.LoggerOptions{
		Name:       "geolog-wan",
		Level:      hclog.LevelFromString(*logLevel),
		JSONFormat: *logJSON,
		Output:     stderr,
	})
	err = wan.Run(ctx, sc, func(s *wan.Server) {
		fmt.Fprintf(stdout, "control http://%s\n", s.ControlAddr())
		for _, st := range s.Net().Stats() {
			fmt.Fprintf(stdout, "link %s %s -> %s latency %s jitter %s\n", st.Name, st.Listen, st.Upstream, st.Latency, st.Jitter)
		}
	})
	if err != nil {
		fmt.Fprintf(stderr, "geolog-wan: %v\n", err)
		return 1
	}
	return 0
}

// parseLinkFlag parses NAME,LISTEN,UPSTREAM[,LATENCY[,JITTER]].
func parseLinkFlag(spec string) (wan.FileLink, error) {
	parts := strings.Split(spec, ",")
	if len(parts) < 3 || len(parts) > 5 {
		return wan.FileLink{}, fmt.Errorf("want NAME,LISTEN,UPSTREAM[,LATENCY[,JITTER]]")
	}
	fl := wan.FileLink{Name: parts[0], Listen: parts[1], Upstream: parts[2]}
	for i, dst := range []**wan.Duration{&fl.Latency, &fl.Jitter} {
		if len(parts) <= 3+i {
			break
		}
		d, err := time.ParseDuration(parts[3+i])
		if err != nil {
			return wan.FileLink{}, err
		}
		wd := wan.Duration(d)
		*dst = &wd
	}
	return fl, nil
}
