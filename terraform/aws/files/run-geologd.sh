#!/bin/bash
# geologd.service's ExecStart (installed by templates/geologd.yaml.tftpl):
# runs geologd with the arguments in /etc/geolog/geologd.args (one a line),
# plus each "FLAG VALUE" line of /etc/geolog/geologd.optional whose FLAG the
# installed geologd lists in --help (so one user data serves a geologd from
# before and after a flag lands).
set -euo pipefail
GEOLOGD=/usr/local/bin/geologd
mapfile -t args </etc/geolog/geologd.args
help=$("$GEOLOGD" --help 2>&1 || true) # Go's flag package exits 2 after --help
if [[ -f /etc/geolog/geologd.optional ]]; then
	while read -r flag value; do
		[[ -n $flag ]] || continue
		# Go's flag package lists "-flag"; accept "--flag" too.
		if grep -qE -- "(^|[[:space:]])--?${flag#--}([[:space:]=]|$)" <<<"$help"; then
			args+=("$flag" "$value")
		else
			echo "run-geologd: this geologd has no $flag: not passed" >&2
		fi
	done </etc/geolog/geologd.optional
fi
exec "$GEOLOGD" "${args[@]}"
