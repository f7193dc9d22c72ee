#!/usr/bin/env bash
# chromium.sh: make sure headless Chromium is installed, for the web
# console's browser test (console.TestConsoleInChromium, driven through
# chromedp). Installs Debian's chromium package with apt-get when it is
# missing (as root); otherwise says what to do and fails, so that make
# test never skips that test silently.
set -uo pipefail

for name in chromium chromium-browser google-chrome; do
	if command -v "$name" >/dev/null 2>&1; then
		exit 0
	fi
done
if [ "$(id -u)" -ne 0 ]; then
	echo "chromium.sh: chromium is missing; install it (apt-get install chromium) or run as root" >&2
	exit 2
fi
echo "chromium.sh: installing chromium with apt-get" >&2
export DEBIAN_FRONTEND=noninteractive
{ apt-get install -y -qq chromium || { apt-get update -qq && apt-get install -y -qq chromium; }; } >&2 ||
	{ echo "chromium.sh: apt-get install chromium failed" >&2; exit 2; }
command -v chromium >/dev/null 2>&1 || { echo "chromium.sh: apt-get installed chromium but it is not on PATH" >&2; exit 2; }
