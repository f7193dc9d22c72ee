#!/usr/bin/env bash
# make test, RUNS times in a row, beside a CPU hog on every core: the test
# suite must hold on a busy machine (a CI runner, a laptop building
# something else), and this is how it is shown.
#
#   scripts/test_loaded.sh [RUNS]     (make test-loaded RUNS=5)
#
# stress-ng --cpu $(nproc) runs for the whole series (installed with
# apt-get when missing, as root); each run's output goes to
# run/test-loaded/<start>/run-<i>.log. One line per run (result and time,
# the failed tests if any), then a summary; exit 1 if any run failed.
#
# Environment: LOAD_CPUS (default nproc) workers; TEST_TARGET (default
# test) the make target each run makes.
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
runs=${1:-5}
[[ $runs =~ ^[1-9][0-9]*$ ]] || { echo "test_loaded.sh: RUNS must be a positive number, got '$runs'" >&2; exit 2; }
cpus=${LOAD_CPUS:-$(nproc)}
target=${TEST_TARGET:-test}

if ! command -v stress-ng >/dev/null 2>&1; then
	if [ "$(id -u)" -ne 0 ]; then
		echo "test_loaded.sh: stress-ng is missing; install it (apt-get install stress-ng) or run as root" >&2
		exit 2
	fi
	echo "test_loaded.sh: installing stress-ng with apt-get" >&2
	export DEBIAN_FRONTEND=noninteractive
	{ apt-get install -y -qq stress-ng || { apt-get update -qq && apt-get install -y -qq stress-ng; }; } >&2 ||
		{ echo "test_loaded.sh: apt-get install stress-ng failed" >&2; exit 2; }
fi

dir=run/test-loaded/$(date +%Y%m%d-%H%M%S)
mkdir -p "$dir"
stress-ng --cpu "$cpus" --timeout 0 --quiet &
hog=$!
# Stop the hog (by its pid: stress-ng stops its workers) however we leave.
trap 'kill "$hog" 2>/dev/null; wait "$hog" 2>/dev/null' EXIT
trap 'exit 130' INT TERM
echo "make $target x$runs beside stress-ng --cpu $cpus (pid $hog) on $(nproc) cores; logs in $dir"

fmt_secs() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }
failed=0
times=()
for i in $(seq 1 "$runs"); do
	log=$dir/run-$i.log
	start=$(date +%s)
	make --no-print-directory "$target" >"$log" 2>&1
	rc=$?
	secs=$(($(date +%s) - start))
	times+=("$(fmt_secs "$secs")")
	if [ "$rc" -eq 0 ]; then
		echo "run $i/$runs: PASS in $(fmt_secs "$secs") (load average $(cut -d' ' -f1-3 /proc/loadavg))"
	else
		failed=$((failed + 1))
		tests=$(grep -E '^\s*--- FAIL' "$log" | awk '{print $3}' | sort -u | tr '\n' ' ')
		pkgs=$(grep -E '^FAIL\s' "$log" | awk '{print $2}' | sort -u | tr '\n' ' ')
		echo "run $i/$runs: FAIL (exit $rc) in $(fmt_secs "$secs"): tests ${tests:-?} packages ${pkgs:-?} ($log)"
	fi
done
echo "$((runs - failed))/$runs runs passed beside stress-ng --cpu $cpus; times: ${times[*]}"
[ "$failed" -eq 0 ]
