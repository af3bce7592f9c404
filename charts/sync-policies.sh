#!/usr/bin/env sh
# Copy the policy library (top-level policies/*.yaml) into the chart's policies/, from which
# templates/policies.yaml renders them when policies.enabled is true.
# Run from anywhere: `sh charts/sync-policies.sh`. tests/unit/test_chart.py fails when they differ.
set -eu
root="$(cd "$(dirname "$0")/.." && pwd)"
dest="$root/charts/disagg-operator/policies"
mkdir -p "$dest"
for f in "$dest"/*.yaml; do
  [ -e "$f" ] && [ ! -e "$root/policies/$(basename "$f")" ] && rm -f "$f"
done
for f in "$root"/policies/*.yaml; do
  [ -e "$f" ] || continue
  cp "$f" "$dest/$(basename "$f")"
done
echo "synced $(ls "$root"/policies/*.yaml 2>/dev/null | wc -l) policy file(s) into $dest"
