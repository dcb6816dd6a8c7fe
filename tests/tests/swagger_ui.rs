//! The REST gateway in a real browser: headless Debian Chromium driven by Playwright.
//! `tests/browser/swagger.mjs` loads `/swagger-ui` from a kas with a real agentk, checks the
//! operations render, authorizes with a JWT and runs GetPods with "Try it out" (200).
//! `tests/browser/events.mjs` watches an agent's cluster state with the browser's own
//! `EventSource` (issue 17).
//!
//! Needs node, `/usr/bin/chromium` (`apt-get install chromium`) and playwright-core
//! (`npm ci --prefix tests/browser`). Under `CI=true` a missing tool fails the test; elsewhere it
//! prints `SKIPPED`.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::path::{Path, PathBuf};
use std::time::Duration;

use kas_e2e::Cluster;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_owned()
}

fn chromium() -> PathBuf {
    std::env::var_os("CHROMIUM").map(PathBuf::from).unwrap_or_else(|| "/usr/bin/chromium".into())
}

/// What is missing to run the browser test, if anything.
fn missing_tools() -> Vec<&'static str> {
    let mut missing = Vec::new();
    let node = std::process::Command::new("node").arg("--version").output();
    if !node.is_ok_and(|o| o.status.success()) {
        missing.push("node (Debian: apt-get install nodejs npm)");
    }
    if !chromium().is_file() {
        missing.push("chromium at /usr/bin/chromium (Debian: apt-get install chromium)");
    }
    if !workspace().join("tests/browser/node_modules/playwright-core/package.json").is_file() {
        missing.push("playwright-core (npm ci --prefix tests/browser; never `npx playwright install`)");
    }
    missing
}

#[tokio::test]
async fn swagger_ui_renders_and_try_it_out_calls_get_pods() {
    let missing = missing_tools();
    if !missing.is_empty() {
        kas_e2e::missing_tool(
            "swagger_ui_renders_and_try_it_out_calls_get_pods",
            &format!("the Swagger UI browser test needs: {}", missing.join("; ")),
        );
        return;
    }
    let c = Cluster::builder().start().await;
    c.kube.add_pod("default", "web-1");
    let _a = c.start_agentk(1, 0, "agentk-0").await;

    let screenshot = std::env::var_os("KAS_SWAGGER_SCREENSHOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| c.dir.path().join("swagger-ui.png"));
    let script = workspace().join("tests/browser/swagger.mjs");
    let run = tokio::process::Command::new("node")
        .arg(&script)
        .arg(c.rest_url(0))
        .arg(c.gitlab_jwt())
        .arg(&screenshot)
        .env("CHROMIUM", chromium())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(180), run).await.expect("browser test timed out").unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "swagger.mjs failed ({}):\nstdout:\n{stdout}\nstderr:\n{stderr}", out.status);
    let seen: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(seen["title"].as_str().map(|t| t.starts_with("kas REST gateway")), Some(true), "{seen}");
    assert_eq!(seen["status"], "200", "{seen}");
    assert_eq!(seen["authorized"], true, "{seen}");
    let body: serde_json::Value = serde_json::from_str(seen["body"].as_str().unwrap()).unwrap();
    assert_eq!(body, serde_json::json!({"pods": [{"namespace": "default", "name": "web-1"}]}));
    assert_eq!(seen["errors"], serde_json::json!([]), "no JavaScript errors on the page");
    eprintln!("Swagger UI screenshot: {}", screenshot.display());
}

/// A browser's `EventSource` (no headers: the JWT as `access_token`) gets the cluster state's
/// snapshot and then the upsert of a pod created on the API server.
#[tokio::test]
async fn a_browser_event_source_watches_the_cluster_state() {
    use tokio::io::AsyncBufReadExt;
    let missing = missing_tools();
    if !missing.is_empty() {
        kas_e2e::missing_tool(
            "a_browser_event_source_watches_the_cluster_state",
            &format!("the EventSource browser test needs: {}", missing.join("; ")),
        );
        return;
    }
    let doc =
        kas::agent::AgentConfigDocument::parse("cluster_state:\n  resources:\n    - {version: v1, resource: pods}\n")
            .unwrap();
    let c = Cluster::builder().agent_configuration(1, doc).start().await;
    c.kube.add_namespace("agentk");
    c.kube.add_pod("default", "web-1");
    let _a = c.start_agentk(1, 0, "agentk-0").await;
    let summary = || async {
        let resp = reqwest::Client::new()
            .get(format!("{}/api/v1/agents/1/cluster_state", c.rest_url(0)))
            .bearer_auth(c.gitlab_jwt())
            .send()
            .await
            .unwrap();
        resp.json::<serde_json::Value>().await.unwrap_or_default()
    };
    kas_e2e::eventually!(summary().await["resources"][0]["synced"] == true, "pods listed");

    let mut child = tokio::process::Command::new("node")
        .arg(workspace().join("tests/browser/events.mjs"))
        .arg(c.rest_url(0))
        .arg(c.gitlab_jwt())
        .arg("1")
        .arg("web-2")
        .env("CHROMIUM", chromium())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let next = async |lines: &mut tokio::io::Lines<_>| -> serde_json::Value {
        let line = tokio::time::timeout(Duration::from_secs(90), lines.next_line()).await.expect("an event").unwrap();
        serde_json::from_str(&line.expect("events.mjs ended early")).unwrap()
    };
    let snapshot = next(&mut lines).await;
    assert_eq!(snapshot["event"], "snapshot", "{snapshot}");
    let data: serde_json::Value = serde_json::from_str(snapshot["data"].as_str().unwrap()).unwrap();
    assert_eq!(data["resources"][0]["objects"][0]["name"], "web-1", "{data}");
    assert!(snapshot["id"].as_str().is_some_and(|id| !id.is_empty()), "the browser saw the event id");
    c.kube.add_pod("default", "web-2");
    let upsert = next(&mut lines).await;
    assert_eq!(upsert["event"], "upsert", "{upsert}");
    let data: serde_json::Value = serde_json::from_str(upsert["data"].as_str().unwrap()).unwrap();
    assert_eq!((data["resource"].as_str(), data["object"]["name"].as_str()), (Some("pods"), Some("web-2")));
    let status = tokio::time::timeout(Duration::from_secs(60), child.wait()).await.expect("events.mjs exits").unwrap();
    assert!(status.success(), "events.mjs failed: {status}");
}
