//! apps/v1 Deployments in the fake: the kind the generic store (`super::store`) serves with the
//! Deployment's own schema check, defaults, validation, generation rule and Table, and a
//! deployment controller the test drives ([`FakeKube::observe_deployment`],
//! [`FakeKube::roll_out`]) so a test decides when a rollout progresses.
//!
//! Server-side apply and the other patch types are the fake's shared ones (`super::patch`). A
//! field the Deployment's schema does not declare fails an apply whatever `fieldValidation` says
//! (see [`super::openapi`]); `fieldValidation=Strict` additionally rejects duplicate keys. The
//! defaults are the Deployment's own (not the pod template's).

use serde_json::{Value, json};

use super::FakeKube;
use super::errors::invalid;
use super::patch::{Refusal, now};
use super::store::{Generation, Kind};

/// The Deployment as the store serves it. Unlike the other namespaced kinds, a Deployment does
/// not need its namespace to exist: the fake's tests (and kubectl's) apply them anywhere.
pub(super) fn kind(base: Kind) -> Kind {
    Kind {
        short_names: vec!["deploy".into()],
        categories: vec!["all".into()],
        status: true,
        status_writes_annotations: true,
        generation: Generation::SpecOrAnnotations,
        needs_namespace: false,
        schema: Some("io.k8s.api.apps.v1.Deployment"),
        prepare: default_spec,
        validate,
        table: Some(table),
        ..base
    }
}

/// A `meta.k8s.io/v1` Table of deployments, with the columns `kubectl get deployments` shows.
fn table(deployments: &[Value], resource_version: &str) -> Value {
    let columns = [
        ("Name", "string", "name"),
        ("Ready", "string", ""),
        ("Up-to-date", "string", ""),
        ("Available", "string", ""),
        ("Age", "string", ""),
    ];
    let n = |v: &Value| v.as_i64().unwrap_or(0);
    let cells = |d: &Value| {
        let s = &d["status"];
        json!([
            d["metadata"]["name"],
            format!("{}/{}", n(&s["readyReplicas"]), n(&d["spec"]["replicas"])),
            n(&s["updatedReplicas"]),
            n(&s["availableReplicas"]),
            "0s",
        ])
    };
    super::table(&columns, deployments, cells, resource_version)
}

/// The Deployment's defaults (k8s.io/kubernetes pkg/apis/apps/v1 defaults.go).
fn default_spec(object: &mut Value, _old: Option<&Value>) {
    if object["status"].is_null() {
        object["status"] = json!({});
    }
    let spec = &mut object["spec"];
    if !spec.is_object() {
        *spec = json!({});
    }
    let mut default = |field: &str, value: Value| {
        if spec.get(field).is_none_or(Value::is_null) {
            spec[field] = value;
        }
    };
    default("replicas", json!(1));
    default("revisionHistoryLimit", json!(10));
    default("progressDeadlineSeconds", json!(600));
    default("strategy", json!({"type": "RollingUpdate"}));
    if spec["strategy"]["type"] == "RollingUpdate" && spec["strategy"].get("rollingUpdate").is_none() {
        spec["strategy"]["rollingUpdate"] = json!({"maxUnavailable": "25%", "maxSurge": "25%"});
    }
}

fn validate(object: &Value) -> Result<(), Refusal> {
    let name = object["metadata"]["name"].as_str().unwrap_or_default();
    let spec = &object["spec"];
    let mut causes: Vec<(&str, &str, String)> = Vec::new();
    let selector = &spec["selector"]["matchLabels"];
    if spec["selector"].is_null() {
        causes.push(("spec.selector", "FieldValueRequired", "Required value".into()));
    } else if let Some(labels) = selector.as_object() {
        let template = &spec["template"]["metadata"]["labels"];
        if labels.iter().any(|(k, v)| template[k] != *v) {
            causes.push((
                "spec.template.metadata.labels",
                "FieldValueInvalid",
                format!("Invalid value: {template}: `selector` does not match template `labels`"),
            ));
        }
    }
    if spec["template"]["spec"]["containers"].as_array().is_none_or(Vec::is_empty) {
        causes.push(("spec.template.spec.containers", "FieldValueRequired", "Required value".into()));
    }
    if causes.is_empty() {
        return Ok(());
    }
    let causes: Vec<(&str, &str, &str)> = causes.iter().map(|(f, r, m)| (*f, *r, m.as_str())).collect();
    Err(Box::new(invalid("apps", "Deployment", name, &causes)))
}

fn condition(type_: &str, status: &str, reason: &str, message: &str, at: &str) -> Value {
    json!({"type": type_, "status": status, "lastUpdateTime": at, "lastTransitionTime": at, "reason": reason, "message": message})
}

impl FakeKube {
    /// The stored Deployment.
    pub fn deployment(&self, namespace: &str, name: &str) -> Option<Value> {
        self.object("apps/v1/deployments", namespace, name)
    }

    /// The deployment controller sees the current spec (`status.observedGeneration`) and starts
    /// the rollout: a new ReplicaSet with none of its replicas updated yet.
    pub fn observe_deployment(&self, namespace: &str, name: &str) {
        self.update_deployment_status(namespace, name, |deployment, at| {
            let spec = &deployment["spec"];
            let old = &deployment["status"];
            let ready = old["readyReplicas"].as_i64().unwrap_or(0);
            let mut status = json!({
                "observedGeneration": deployment["metadata"]["generation"],
                "replicas": old["replicas"].as_i64().unwrap_or(0),
                "updatedReplicas": 0,
                "readyReplicas": ready,
                "availableReplicas": old["availableReplicas"].as_i64().unwrap_or(0),
                "unavailableReplicas": spec["replicas"].as_i64().unwrap_or(1) - ready,
                "conditions": [
                    condition("Progressing", "True", "ReplicaSetUpdated", &format!("ReplicaSet \"{name}-{}\" is progressing.", template_hash(spec)), at),
                    if ready > 0 {
                        condition("Available", "True", "MinimumReplicasAvailable", "Deployment has minimum availability.", at)
                    } else {
                        condition("Available", "False", "MinimumReplicasUnavailable", "Deployment does not have minimum availability.", at)
                    },
                ],
            });
            if status["unavailableReplicas"].as_i64().unwrap_or(0) <= 0 {
                status.as_object_mut().map(|s| s.remove("unavailableReplicas"));
            }
            status
        });
    }

    /// The deployment controller finishes the rollout: every replica updated, ready and
    /// available, conditions as the real controller leaves them.
    pub fn roll_out(&self, namespace: &str, name: &str) {
        self.update_deployment_status(namespace, name, |deployment, at| {
            let replicas = deployment["spec"]["replicas"].as_i64().unwrap_or(1);
            json!({
                "observedGeneration": deployment["metadata"]["generation"],
                "replicas": replicas, "updatedReplicas": replicas, "readyReplicas": replicas,
                "availableReplicas": replicas,
                "conditions": [
                    condition("Available", "True", "MinimumReplicasAvailable", "Deployment has minimum availability.", at),
                    condition("Progressing", "True", "NewReplicaSetAvailable", &format!("ReplicaSet \"{name}-{}\" has successfully progressed.", template_hash(&deployment["spec"])), at),
                ],
            })
        });
    }

    /// A status write by kube-controller-manager through `deployments/status` (its own
    /// managedFields entry; the revision annotation it keeps).
    fn update_deployment_status(&self, namespace: &str, name: &str, status: impl FnOnce(&Value, &str) -> Value) {
        let Some(mut deployment) = self.deployment(namespace, name) else {
            panic!("no deployment {namespace}/{name} in the fake");
        };
        let at = now();
        deployment["status"] = status(&deployment, &at);
        // A new pod template is a new ReplicaSet, and a new revision.
        let revision =
            deployment["metadata"]["annotations"]["deployment.kubernetes.io/revision"].as_str().unwrap_or("0");
        let mut revision = revision.parse::<u64>().unwrap_or(0);
        let template = template_hash(&deployment["spec"]);
        let key = (namespace.to_owned(), name.to_owned());
        if self.lock().deployment_templates.insert(key, template.clone()).as_ref() != Some(&template) {
            revision += 1;
        }
        deployment["metadata"]["annotations"]["deployment.kubernetes.io/revision"] = json!(revision.to_string());
        self.write_status("apps/v1/deployments", deployment, "kube-controller-manager");
    }
}

/// A stable stand-in for the pod-template-hash.
fn template_hash(spec: &Value) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(spec["template"].to_string().as_bytes());
    hex::encode(&digest[..5])
}

impl FakeKube {
    /// Creates or updates a Deployment (`spec.replicas`, exactly these labels; a new one selects
    /// and templates pods labelled `app: <name>`), then writes its status as the deployment
    /// controller would once `ready_replicas` of them are ready (fields that are zero left out,
    /// as the real status omits them). Returns the stored Deployment.
    pub fn put_deployment(
        &self,
        namespace: &str,
        name: &str,
        replicas: i64,
        ready_replicas: i64,
        labels: &[(&str, &str)],
    ) -> Option<Value> {
        let mut deployment = self.deployment(namespace, name).unwrap_or_else(|| {
            json!({
                "apiVersion": "apps/v1", "kind": "Deployment",
                "spec": {
                    "selector": {"matchLabels": {"app": name}},
                    "template": {
                        "metadata": {"labels": {"app": name}},
                        "spec": {"containers": [{"name": "main", "image": "busybox"}]},
                    },
                },
            })
        });
        deployment["metadata"]["name"] = json!(name);
        deployment["metadata"]["namespace"] = json!(namespace);
        deployment["metadata"]["labels"] =
            Value::Object(labels.iter().map(|(k, v)| ((*k).to_owned(), json!(v))).collect());
        deployment["spec"]["replicas"] = json!(replicas);
        let mut deployment = self.put_object("apps/v1/deployments", deployment)?;
        let at = now();
        let available = ready_replicas > 0 && ready_replicas >= replicas;
        let mut status = json!({
            "observedGeneration": deployment["metadata"]["generation"],
            "replicas": replicas, "updatedReplicas": replicas, "readyReplicas": ready_replicas,
            "availableReplicas": ready_replicas, "unavailableReplicas": replicas - ready_replicas,
            "conditions": [if available {
                condition("Available", "True", "MinimumReplicasAvailable", "Deployment has minimum availability.", &at)
            } else {
                condition("Available", "False", "MinimumReplicasUnavailable", "Deployment does not have minimum availability.", &at)
            }],
        });
        if let Some(fields) = status.as_object_mut() {
            fields.retain(|_, v| v.as_i64().is_none_or(|n| n > 0));
        }
        deployment["status"] = status;
        self.write_status("apps/v1/deployments", deployment, "kube-controller-manager");
        self.deployment(namespace, name)
    }

    /// Deletes a Deployment. False if there was none.
    pub fn delete_deployment(&self, namespace: &str, name: &str) -> bool {
        self.delete_object("apps/v1/deployments", namespace, name)
    }
}
