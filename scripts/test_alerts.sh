#!/usr/bin/env bash
# Checks and unit-tests the alerting rules (deploy/prometheus/alerts.yml)
# with promtool: `promtool check rules` and `promtool test rules` over
# deploy/prometheus/alerts_test.yml. promtool comes from the Debian
# package prometheus, installed with apt-get when it is missing (as root;
# otherwise the script says what to install). PROMTOOL=path picks another.
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT/deploy/prometheus"
promtool=${PROMTOOL:-promtool}

if ! command -v "$promtool" >/dev/null 2>&1; then
	if [ "$(id -u)" -ne 0 ]; then
		echo "test_alerts.sh: promtool is missing; install it (apt-get install prometheus) or run as root" >&2
		exit 2
	fi
	echo "test_alerts.sh: installing prometheus (for promtool) with apt-get" >&2
	export DEBIAN_FRONTEND=noninteractive
	{ apt-get install -y -qq prometheus || { apt-get update -qq && apt-get install -y -qq prometheus; }; } >&2 ||
		{ echo "test_alerts.sh: apt-get install prometheus failed" >&2; exit 2; }
	# The package starts a Prometheus server; make test does not want one.
	if command -v systemctl >/dev/null 2>&1; then systemctl disable --now prometheus >/dev/null 2>&1 || true; fi
fi

"$promtool" check rules alerts.yml || exit 1
"$promtool" test rules alerts_test.yml || exit 1
