#!/usr/bin/env sh
# Copy the generated CRDs (top-level crds/, written by `disagg crds`) into the chart's crds/.
# Run from anywhere: `sh charts/sync-crds.sh`. tests/unit/test_chart.py fails when they differ.
set -eu
root="$(cd "$(dirname "$0")/.." && pwd)"
dest="$root/charts/disagg-operator/crds"
for f in "$dest"/disagg.dev_*.yaml; do
  [ -e "$f" ] && [ ! -e "$root/crds/$(basename "$f")" ] && rm -f "$f"
done
for f in "$root"/crds/*.yaml; do
  [ -e "$f" ] || continue
  cp "$f" "$dest/$(basename "$f")"
done
echo "synced $(ls "$root"/crds/*.yaml 2>/dev/null | wc -l) CRD file(s) into $dest"
