#!/usr/bin/env bash
# make release VERSION=v0.1.0: versioned archives of geolog's binaries with
# checksums, and the container image.
#
#   dist/geolog-VERSION-linux-ARCH.tar.gz   geologd, geolog, geolog-wan,
#                                           README.md, docs/, deploy/
#   dist/geolog-VERSION-image-amd64.tar     the container image (docker/podman load)
#   dist/SHA256SUMS                         sha256sum -c checks them all
#
# Binaries are static (CGO_ENABLED=0), stripped of local paths (-trimpath),
# and say their version and commit (geolog version, geologd --version).
# ARCHES (default "amd64 arm64") picks the architectures; OUT (default
# dist) the folder; IMAGE=0 skips the image.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=${VERSION:-}
[[ $VERSION =~ ^v[0-9]+\.[0-9]+\.[0-9]+([-+][0-9A-Za-z.-]+)?$ ]] || { echo "release: VERSION=vMAJOR.MINOR.PATCH is required (got '$VERSION')" >&2; exit 2; }
ARCHES=${ARCHES:-amd64 arm64}
OUT=${OUT:-dist}
IMAGE=${IMAGE:-1}
GO=${GO:-go}
commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)
git diff --quiet HEAD 2>/dev/null || commit="$commit-modified"
# Reproducible: every file in the archives is dated at the commit.
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}
ldflags="-s -w -X github.com/geolog/geolog/internal/version.Version=$VERSION -X github.com/geolog/geolog/internal/version.Commit=$commit"
mkdir -p "$OUT"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
archives=()
for arch in $ARCHES; do
	name="geolog-$VERSION-linux-$arch"
	stage="$work/$name"
	mkdir -p "$stage"
	CGO_ENABLED=0 GOOS=linux GOARCH=$arch $GO build -trimpath -ldflags "$ldflags" -o "$stage/" ./cmd/geologd ./cmd/geolog ./cmd/geolog-wan
	cp -r README.md docs deploy "$stage/"
	tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$SOURCE_DATE_EPOCH" \
		-C "$work" -czf "$OUT/$name.tar.gz" "$name"
	archives+=("$name.tar.gz")
	if [[ $IMAGE == 1 && $arch == amd64 ]]; then
		$GO run ./cmd/geolog-image --bin-dir "$stage" --arch "$arch" --tag "geolog:$VERSION" --out "$OUT/geolog-$VERSION-image-$arch.tar" >/dev/null
		archives+=("geolog-$VERSION-image-$arch.tar")
	fi
	echo "release: $OUT/$name.tar.gz"
done
(cd "$OUT" && sha256sum "${archives[@]}" >SHA256SUMS)
echo "release: $OUT/SHA256SUMS"
