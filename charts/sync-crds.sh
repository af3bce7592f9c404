#!/usr/bin/env sh
# Copy the generated CRDs (top-level crds/, written by `disagg crds`) into the charts:
# - charts/disagg-operator/crds/: as they are (helm installs crds/ on `helm install`, never on upgrade);
# - charts/disagg-crds/templates/: with helm.sh/resource-policy: keep (value `keep`) added to metadata, and
#   kopf's peering CRDs (charts/disagg-operator/crds/kopf-peering.yaml) too. As templates, helm upgrades
#   them like any object on `helm upgrade` (see charts/disagg-crds/README.md for why a separate chart).
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

templates="$root/charts/disagg-crds/templates"
mkdir -p "$templates"
for f in "$templates"/*.yaml; do
  [ -e "$f" ] && [ ! -e "$root/crds/$(basename "$f")" ] && [ ! -e "$dest/$(basename "$f")" ] && rm -f "$f"
done
for f in "$root"/crds/*.yaml "$dest/kopf-peering.yaml"; do
  [ -e "$f" ] || continue
  # The CRDs must be plain YAML: a `{{` would be read as a template action.
  if grep -q '{{' "$f"; then echo "$f contains '{{': not usable as a helm template" >&2; exit 1; fi
  # The generated CRDs carry no metadata.annotations (checked by tests/unit/test_chart.py), so the
  # annotations block inserted after each top-level `metadata:` is the only one.
  awk -v src="${f#"$root"/}" '
    NR == 1 { print "# Copied by charts/sync-crds.sh from " src " with helm.sh/resource-policy added. Do not edit." }
    { print }
    /^metadata:$/ {
      print "  {{- if .Values.keep }}"
      print "  annotations:"
      print "    helm.sh/resource-policy: keep"
      print "  {{- end }}"
    }
  ' "$f" > "$templates/$(basename "$f")"
done
echo "synced $(ls "$templates"/*.yaml | wc -l) CRD template(s) into $templates"
