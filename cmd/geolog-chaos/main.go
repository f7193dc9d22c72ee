// Command geolog-chaos runs chaos scenarios (package chaos) against geolog
// clusters and prints a table of what the history checkers found.
//
//	geolog-chaos                              every built-in scenario, each on a fresh local cluster
//	geolog-chaos --scenarios slice            the short slice make test runs
//	geolog-chaos --scenarios zombie-leader,leader-kill-loop --seed 7
//	geolog-chaos --env run/cluster/env        attach to a running cluster (scripts/cluster.sh, terraform: make chaos does, through scripts/chaos_tf.sh)
//	geolog-chaos --print > s.json; geolog-chaos --file s.json
//
// Exit status: 0 when every scenario passed or was skipped, 1 on a safety
// violation or a harness error, 3 when no violation was found but a check
// could not complete (UNVERIFIED), 2 for bad flags.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/geolog/geolog/chaos"
	"github.com/hashicorp/go-hclog"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("geolog-chaos", flag.ContinueOnError)
	fs.SetOutput(stderr)
	exe, _ := os.Executable()
	envFile := fs.String("env", "", "attach to the running cluster this env file describes (GEOLOG_ADDR_<REGION>, GEOLOG_WAN_CONTROL, pids/) instead of starting one per scenario")
	binDir := fs.String("bin", filepath.Dir(exe), "folder holding geologd and geolog-wan (make build's bin/)")
	dir := fs.String("dir", "run/chaos", "folder for the local clusters, histories and visualisations")
	names := fs.String("scenarios", "all", `"all", "slice", or a comma-separated list of scenario names`)
	file := fs.String("file", "", "read the scenarios from this JSON file (a list, as --print writes) instead of the built-in ones")
	printOnly := fs.Bool("print", false, "print the selected scenarios as JSON and exit")
	seed := fs.Uint64("seed", 1, "seed of the harness's choices (targets, followers)")
	portMin := fs.Int("port-min", 0, "lowest port of the local clusters (0 with --port-max 0: the free ports above the kernel's ephemeral range, GEOLOG_TEST_PORTS overrides)")
	portMax := fs.Int("port-max", 0, "highest port of the local clusters")
	pgScript := fs.String("pg-script", "", "scripts/pg.sh, for scenarios with a lease store (default: ../scripts/pg.sh from --bin)")
	pgPort := fs.Int("pg-port", 0, "port of the local clusters' PostgreSQL (the lease store; its data lives in each cluster's folder); 0: a free one of the clusters' range")
	logLevel := fs.String("log-level", "info", "the harness's log level (trace, debug, info, warn, error)")
	nodeLogLevel := fs.String("node-log-level", "info", "the local clusters' nodes' --log-level")
	linearTimeout := fs.Duration("linear-timeout", time.Minute, "bound of the linearizability search per range")
	insecure := fs.Bool("insecure", false, "run the local clusters' nodes with --insecure (default: TLS, with a PKI in each cluster's folder)")
	noAtRest := fs.Bool("no-atrest", false, "run the local clusters' nodes without encryption at rest (default: a --kek-file per node in each cluster's keks/)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "geolog-chaos: unexpected arguments %q\n", fs.Args())
		return 2
	}
	scenarios, err := selectScenarios(*names, *file)
	if err != nil {
		fmt.Fprintf(stderr, "geolog-chaos: %v\n", err)
		return 2
	}
	if *printOnly {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(scenarios); err != nil {
			return 1
		}
		return 0
	}
	logger := hclog.New(&hclog.LoggerOptions{Name: "chaos", Level: hclog.LevelFromString(*logLevel), Output: stderr})
	var factory chaos.ClusterFactory
	if *envFile != "" {
		factory = chaos.EnvFactory(*envFile)
	} else {
		if *pgScript == "" {
			*pgScript = filepath.Join(*binDir, "..", "scripts", "pg.sh")
		}
		factory = chaos.LocalFactory(chaos.LocalConfig{BinDir: *binDir, Dir: filepath.Join(*dir, "clusters"),
			PortMin: *portMin, PortMax: *portMax, PGScript: *pgScript, PGPort: *pgPort, LogLevel: *nodeLogLevel, Logger: logger,
			Insecure: *insecure, NoAtRest: *noAtRest})
	}
	cfg := chaos.RunConfig{Cluster: factory, Seed: *seed, Dir: *dir, LinearTimeout: *linearTimeout, Logger: logger}
	var results []chaos.Result
	for _, sc := range scenarios {
		if ctx.Err() != nil {
			break
		}
		logger.Info("scenario", "name", sc.Name, "description", sc.Description)
		r := chaos.Run(ctx, cfg, sc)
		logger.Info("scenario done", "name", sc.Name, "result", r.Status(), "seconds", int(r.Elapsed.Seconds()))
		results = append(results, r)
	}
	fmt.Fprintln(stdout)
	chaos.WriteTable(stdout, results)
	code := 0
	for _, r := range results {
		switch r.Status() {
		case "FAIL", "ERROR":
			code = 1
		case "UNVERIFIED":
			if code == 0 {
				code = 3
			}
		}
	}
	if ctx.Err() != nil && code == 0 {
		code = 1
	}
	return code
}

func selectScenarios(names, file string) ([]chaos.Scenario, error) {
	all := chaos.Scenarios()
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, err
		}
		all = nil
		if err := json.Unmarshal(b, &all); err != nil {
			return nil, fmt.Errorf("%s: %w", file, err)
		}
	}
	switch names {
	case "all":
		return all, validate(all)
	case "slice":
		return chaos.Slice(), nil
	}
	var out []chaos.Scenario
	for _, name := range strings.Split(names, ",") {
		i := slices.IndexFunc(all, func(s chaos.Scenario) bool { return s.Name == strings.TrimSpace(name) })
		if i < 0 {
			return nil, fmt.Errorf("no scenario %q", name)
		}
		out = append(out, all[i])
	}
	return out, validate(out)
}

func validate(scenarios []chaos.Scenario) error {
	for _, s := range scenarios {
		if err := s.Validate(); err != nil {
			return err
		}
	}
	return nil
}
