#![allow(clippy::unwrap_used)]
use kas_e2e::{Cluster, eventually};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hammer() {
    let c = Cluster::builder().redis().kas(2).start().await;
    let _a = c.start_agentk(1, 1, "agentk-0").await;
    c.kube.add_pod("default", "web-1");
    let url = format!("{}/api/v1/agents/1/kubernetes/api/v1/namespaces/default/pods/web-1", c.rest_url(0));
    let jwt = c.gitlab_jwt();
    let client = reqwest::Client::new();
    eventually!(client.get(&url).bearer_auth(&jwt).send().await.is_ok_and(|r| r.status().is_success()), "routed");
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let (client, url, jwt) = (client.clone(), url.clone(), jwt.clone());
        tasks.push(tokio::spawn(async move {
            let mut errors = Vec::new();
            for _ in 0..300 {
                match client.get(&url).bearer_auth(&jwt).send().await {
                    Ok(r) if r.status().is_success() => { if let Err(e) = r.bytes().await { errors.push(format!("body: {e:?}")); } }
                    Ok(r) => errors.push(format!("{}: {}", r.status(), r.text().await.unwrap_or_default())),
                    Err(e) => errors.push(format!("{e:?}")),
                }
            }
            errors
        }));
    }
    let mut all = Vec::new();
    for t in tasks { all.extend(t.await.unwrap()); }
    eprintln!("{} errors; first: {:?}", all.len(), all.iter().take(3).collect::<Vec<_>>());
    assert!(all.is_empty());
}
