#!/usr/bin/env bash
# Unit-test the chart's alerts with promtool: render the PrometheusRule, run
# tests/alerts/gpuheal_alerts_test.yaml against it. Usage: hack/test-alerts.sh [promtool]
# (promtool is not part of the sandbox toolchain; any Prometheus 2.x/3.x promtool works).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
promtool=${1:-promtool}
helm=${HELM:-$(ls -d "$HOME"/.cache/gpuheal/bin/*/ | head -1)helm}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$helm" template r "$root/deploy/helm/gpuheal" --kube-version=v1.36.3 \
  --set monitoring.prometheusRule.enabled=true --show-only templates/prometheusrule.yaml \
  | python3 -c 'import sys, yaml; print(yaml.safe_dump({"groups": yaml.safe_load(sys.stdin)["spec"]["groups"]}))' \
  > "$work/rules.yaml"
cp "$root/tests/alerts/gpuheal_alerts_test.yaml" "$work/"
"$promtool" check rules "$work/rules.yaml"
"$promtool" test rules "$work/gpuheal_alerts_test.yaml"
