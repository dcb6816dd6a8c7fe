//! The fake's OpenAPI: a slice of the real apps/v1 and core/v1 schemas (the types a Deployment
//! and a Pod are made of, with their real field names), served the way the API server serves it,
//! and the schema check server-side apply makes with it.
//!
//! What kubectl asks (k8s.io/kubectl pkg/cmd/util/factory_client_access.go `Validator`, 1.27 to
//! 1.33 alike): with the default `--validate=strict` it asks the server whether the PATCH of the
//! object's kind takes the `fieldValidation` query parameter, first through OpenAPI v3
//! (k8s.io/cli-runtime `queryParamVerifierV3`: `/openapi/v3`, then the group-version document it
//! points to, looking for a PATCH operation with the kind's `x-kubernetes-group-version-kind`
//! and a `fieldValidation` parameter), and only if `/openapi/v3` is not found through v2. When
//! the server says yes, kubectl validates nothing itself and sends `fieldValidation=Strict`.
//! kubectl 1.27 and 1.28 also parse `/openapi/v2` (protobuf) eagerly while building that
//! validator (`f.OpenAPISchema()`), and fail if they cannot; 1.29 on only read it when they fall
//! back to client-side validation. The fake's v2 document is a valid one without paths or
//! definitions: enough for that parse, and never consulted for validation since v3 answers.

use axum::extract::{Path, Query};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};

const META: &str = "io.k8s.apimachinery.pkg.apis.meta.v1";

fn reference(name: &str) -> Value {
    json!({"allOf": [{"$ref": format!("#/components/schemas/{name}")}], "default": {}})
}
fn string() -> Value {
    json!({"type": "string", "default": ""})
}
fn integer() -> Value {
    json!({"type": "integer", "format": "int32"})
}
fn boolean() -> Value {
    json!({"type": "boolean"})
}
/// An object the fake does not describe further (the real schema does): any fields accepted.
fn opaque() -> Value {
    json!({"type": "object"})
}
fn array(items: Value) -> Value {
    json!({"type": "array", "items": items})
}
fn keyed_by_name(items: Value) -> Value {
    json!({"type": "array", "items": items, "x-kubernetes-list-map-keys": ["name"], "x-kubernetes-list-type": "map"})
}
fn map_of_strings() -> Value {
    json!({"type": "object", "additionalProperties": {"type": "string", "default": ""}})
}
fn object(description: &str, fields: &[(&str, Value)]) -> Value {
    let properties: Map<String, Value> = fields.iter().map(|(k, v)| ((*k).to_owned(), v.clone())).collect();
    json!({"description": description, "type": "object", "properties": properties})
}
fn kind(mut schema: Value, group: &str, version: &str, kind: &str) -> Value {
    schema["x-kubernetes-group-version-kind"] = json!([{"group": group, "kind": kind, "version": version}]);
    schema
}

/// `components.schemas`: the real type names and field names; types the fake does not describe
/// are open objects.
pub(super) fn schemas() -> Map<String, Value> {
    let opaque_list = || array(opaque());
    let object_meta = object(
        "ObjectMeta is metadata that all persisted resources must have.",
        &[
            ("annotations", map_of_strings()),
            ("creationTimestamp", json!({"type": "string", "format": "date-time"})),
            ("deletionGracePeriodSeconds", json!({"type": "integer", "format": "int64"})),
            ("deletionTimestamp", json!({"type": "string", "format": "date-time"})),
            ("finalizers", array(string())),
            ("generateName", string()),
            ("generation", json!({"type": "integer", "format": "int64"})),
            ("labels", map_of_strings()),
            ("managedFields", opaque_list()),
            ("name", string()),
            ("namespace", string()),
            ("ownerReferences", opaque_list()),
            ("resourceVersion", string()),
            ("selfLink", string()),
            ("uid", string()),
        ],
    );
    let container = object(
        "A single application container that you want to run within a pod.",
        &[
            ("args", array(string())),
            ("command", array(string())),
            ("env", opaque_list()),
            ("envFrom", opaque_list()),
            ("image", string()),
            ("imagePullPolicy", string()),
            ("lifecycle", opaque()),
            ("livenessProbe", opaque()),
            ("name", string()),
            ("ports", opaque_list()),
            ("readinessProbe", opaque()),
            ("resizePolicy", opaque_list()),
            ("resources", opaque()),
            ("restartPolicy", string()),
            ("securityContext", opaque()),
            ("startupProbe", opaque()),
            ("stdin", boolean()),
            ("stdinOnce", boolean()),
            ("terminationMessagePath", string()),
            ("terminationMessagePolicy", string()),
            ("tty", boolean()),
            ("volumeDevices", opaque_list()),
            ("volumeMounts", opaque_list()),
            ("workingDir", string()),
        ],
    );
    let containers = || keyed_by_name(reference("io.k8s.api.core.v1.Container"));
    let pod_spec = object(
        "PodSpec is a description of a pod.",
        &[
            ("activeDeadlineSeconds", integer()),
            ("affinity", opaque()),
            ("automountServiceAccountToken", boolean()),
            ("containers", containers()),
            ("dnsConfig", opaque()),
            ("dnsPolicy", string()),
            ("enableServiceLinks", boolean()),
            ("ephemeralContainers", opaque_list()),
            ("hostAliases", opaque_list()),
            ("hostIPC", boolean()),
            ("hostNetwork", boolean()),
            ("hostPID", boolean()),
            ("hostUsers", boolean()),
            ("hostname", string()),
            ("imagePullSecrets", opaque_list()),
            ("initContainers", containers()),
            ("nodeName", string()),
            ("nodeSelector", map_of_strings()),
            ("os", opaque()),
            ("overhead", opaque()),
            ("preemptionPolicy", string()),
            ("priority", integer()),
            ("priorityClassName", string()),
            ("readinessGates", opaque_list()),
            ("resourceClaims", opaque_list()),
            ("resources", opaque()),
            ("restartPolicy", string()),
            ("runtimeClassName", string()),
            ("schedulerName", string()),
            ("schedulingGates", opaque_list()),
            ("securityContext", opaque()),
            ("serviceAccount", string()),
            ("serviceAccountName", string()),
            ("setHostnameAsFQDN", boolean()),
            ("shareProcessNamespace", boolean()),
            ("subdomain", string()),
            ("terminationGracePeriodSeconds", json!({"type": "integer", "format": "int64"})),
            ("tolerations", opaque_list()),
            ("topologySpreadConstraints", opaque_list()),
            ("volumes", opaque_list()),
        ],
    );
    let int_or_string = || json!({"x-kubernetes-int-or-string": true});
    let mut all = Map::new();
    let mut add = |name: String, schema: Value| {
        all.insert(name, schema);
    };
    add(format!("{META}.ObjectMeta"), object_meta);
    add(
        format!("{META}.LabelSelector"),
        object(
            "A label selector is a label query over a set of resources.",
            &[("matchExpressions", opaque_list()), ("matchLabels", map_of_strings())],
        ),
    );
    add(
        format!("{META}.Patch"),
        object("Patch is provided to give a concrete name and type to the Kubernetes PATCH request body.", &[]),
    );
    add("io.k8s.api.core.v1.Container".into(), container);
    add("io.k8s.api.core.v1.PodSpec".into(), pod_spec);
    add(
        "io.k8s.api.core.v1.PodTemplateSpec".into(),
        object(
            "PodTemplateSpec describes the data a pod should have when created from a template",
            &[
                ("metadata", reference(&format!("{META}.ObjectMeta"))),
                ("spec", reference("io.k8s.api.core.v1.PodSpec")),
            ],
        ),
    );
    add(
        "io.k8s.api.core.v1.Pod".into(),
        kind(
            object(
                "Pod is a collection of containers that can run on a host.",
                &[
                    ("apiVersion", json!({"type": "string"})),
                    ("kind", json!({"type": "string"})),
                    ("metadata", reference(&format!("{META}.ObjectMeta"))),
                    ("spec", reference("io.k8s.api.core.v1.PodSpec")),
                    ("status", opaque()),
                ],
            ),
            "",
            "v1",
            "Pod",
        ),
    );
    add(
        "io.k8s.api.apps.v1.RollingUpdateDeployment".into(),
        object(
            "Spec to control the desired behavior of rolling update.",
            &[("maxSurge", int_or_string()), ("maxUnavailable", int_or_string())],
        ),
    );
    add(
        "io.k8s.api.apps.v1.DeploymentStrategy".into(),
        object(
            "DeploymentStrategy describes how to replace existing pods with new ones.",
            &[("rollingUpdate", reference("io.k8s.api.apps.v1.RollingUpdateDeployment")), ("type", string())],
        ),
    );
    add(
        "io.k8s.api.apps.v1.DeploymentSpec".into(),
        object(
            "DeploymentSpec is the specification of the desired behavior of the Deployment.",
            &[
                ("minReadySeconds", integer()),
                ("paused", boolean()),
                ("progressDeadlineSeconds", integer()),
                ("replicas", integer()),
                ("revisionHistoryLimit", integer()),
                ("selector", reference(&format!("{META}.LabelSelector"))),
                ("strategy", reference("io.k8s.api.apps.v1.DeploymentStrategy")),
                ("template", reference("io.k8s.api.core.v1.PodTemplateSpec")),
            ],
        ),
    );
    add(
        "io.k8s.api.apps.v1.DeploymentCondition".into(),
        object(
            "DeploymentCondition describes the state of a deployment at a certain point.",
            &[
                ("lastTransitionTime", string()),
                ("lastUpdateTime", string()),
                ("message", string()),
                ("reason", string()),
                ("status", string()),
                ("type", string()),
            ],
        ),
    );
    add(
        "io.k8s.api.apps.v1.DeploymentStatus".into(),
        object(
            "DeploymentStatus is the most recently observed status of the Deployment.",
            &[
                ("availableReplicas", integer()),
                ("collisionCount", integer()),
                (
                    "conditions",
                    json!({"type": "array", "items": reference("io.k8s.api.apps.v1.DeploymentCondition"),
                           "x-kubernetes-list-map-keys": ["type"], "x-kubernetes-list-type": "map"}),
                ),
                ("observedGeneration", json!({"type": "integer", "format": "int64"})),
                ("readyReplicas", integer()),
                ("replicas", integer()),
                ("terminatingReplicas", integer()),
                ("unavailableReplicas", integer()),
                ("updatedReplicas", integer()),
            ],
        ),
    );
    add(
        "io.k8s.api.apps.v1.Deployment".into(),
        kind(
            object(
                "Deployment enables declarative updates for Pods and ReplicaSets.",
                &[
                    ("apiVersion", json!({"type": "string"})),
                    ("kind", json!({"type": "string"})),
                    ("metadata", reference(&format!("{META}.ObjectMeta"))),
                    ("spec", reference("io.k8s.api.apps.v1.DeploymentSpec")),
                    ("status", reference("io.k8s.api.apps.v1.DeploymentStatus")),
                ],
            ),
            "apps",
            "v1",
            "Deployment",
        ),
    );
    all
}

/// The schema a `$ref` (direct or in `allOf`) points to, or the schema itself.
fn resolve<'a>(schemas: &'a Map<String, Value>, schema: &'a Value) -> &'a Value {
    let reference = schema["$ref"].as_str().or_else(|| schema["allOf"][0]["$ref"].as_str());
    match reference.and_then(|r| r.strip_prefix("#/components/schemas/")) {
        Some(name) => schemas.get(name).unwrap_or(&Value::Null),
        None => schema,
    }
}

/// Server-side apply's schema check (structured-merge-diff's `ObjectToTyped`): every field of
/// the applied object must be declared. Returns the first undeclared field's path, written as
/// structured-merge-diff writes paths (`.spec.template.spec.containers[name="main"].foo`).
pub(super) fn undeclared_field(schema_name: &str, value: &Value) -> Option<String> {
    let schemas = schemas();
    let schema = schemas.get(schema_name)?;
    walk(&schemas, schema, value, String::new())
}

fn walk(schemas: &Map<String, Value>, schema: &Value, value: &Value, path: String) -> Option<String> {
    let schema = resolve(schemas, schema);
    match value {
        Value::Object(fields) => {
            if let Some(properties) = schema["properties"].as_object().filter(|p| !p.is_empty()) {
                for (name, field) in fields {
                    let here = format!("{path}.{name}");
                    let Some(field_schema) = properties.get(name) else {
                        return Some(here);
                    };
                    if let Some(found) = walk(schemas, field_schema, field, here) {
                        return Some(found);
                    }
                }
            } else if let Some(values) = schema.get("additionalProperties") {
                for (name, field) in fields {
                    if let Some(found) = walk(schemas, values, field, format!("{path}.{name}")) {
                        return Some(found);
                    }
                }
            }
            None
        }
        Value::Array(items) => {
            let item_schema = schema.get("items")?;
            items.iter().enumerate().find_map(|(i, item)| {
                let key = match item["name"].as_str() {
                    Some(name) if schema["x-kubernetes-list-map-keys"] == json!(["name"]) => {
                        format!("[name=\"{name}\"]")
                    }
                    _ => format!("[{i}]"),
                };
                walk(schemas, item_schema, item, format!("{path}{key}"))
            })
        }
        _ => None,
    }
}

/// One kind's REST operations, as the real document describes them (operation ids, the
/// `x-kubernetes-*` extensions, the query parameters each verb takes).
fn resource_paths(
    prefix: &str,
    group: &str,
    version: &str,
    kind: &str,
    plural: &str,
    schema: &str,
) -> Map<String, Value> {
    let id_group = if group.is_empty() {
        "Core".to_owned()
    } else {
        let mut g = group.to_owned();
        g[..1].make_ascii_uppercase();
        g
    };
    let id_version = {
        let mut v = version.to_owned();
        v[..1].make_ascii_uppercase();
        v
    };
    let gvk = json!({"group": group, "kind": kind, "version": version});
    let query = |name: &str, description: &str| json!({"name": name, "in": "query", "description": description, "schema": {"type": "string", "uniqueItems": true}});
    let ok = |code: &str| {
        json!({code: {"description": "OK", "content": {"application/json": {"schema": {"$ref": format!("#/components/schemas/{schema}")}}}},
               "401": {"description": "Unauthorized"}})
    };
    let tag = if group.is_empty() { format!("core_{version}") } else { format!("{group}_{version}") };
    let op = |verb: &str, action: &str, what: &str, params: Vec<Value>, code: &str| {
        json!({
            "tags": [tag], "description": format!("{verb} the specified {kind}"),
            "operationId": format!("{action}{id_group}{id_version}{what}"),
            "parameters": params, "responses": ok(code),
            "x-kubernetes-action": action, "x-kubernetes-group-version-kind": gvk,
        })
    };
    let dry_run = query("dryRun", "When present, indicates that modifications should not be persisted.");
    let field_manager = query(
        "fieldManager",
        "fieldManager is a name associated with the actor or entity that is making these changes.",
    );
    let field_validation = query(
        "fieldValidation",
        "fieldValidation instructs the server on how to handle objects in the request (POST/PUT/PATCH) containing unknown or duplicate fields. Valid values are: - Ignore - Warn - Strict",
    );
    let force = json!({"name": "force", "in": "query", "description": "Force is going to \"force\" Apply requests.", "schema": {"type": "boolean", "uniqueItems": true}});
    let path_param = |name: &str| json!({"name": name, "in": "path", "required": true, "schema": {"type": "string", "uniqueItems": true}});
    let mut patch = op(
        "partially update",
        "patch",
        &format!("Namespaced{kind}"),
        vec![dry_run.clone(), field_manager.clone(), field_validation.clone(), force],
        "200",
    );
    let patch_body = json!({"schema": {"$ref": format!("#/components/schemas/{META}.Patch")}});
    patch["requestBody"] = json!({"content": {
        "application/apply-patch+yaml": patch_body, "application/json-patch+json": patch_body,
        "application/merge-patch+json": patch_body, "application/strategic-merge-patch+json": patch_body,
    }, "required": true});
    let mut create =
        op("create", "post", &format!("Namespaced{kind}"), vec![dry_run, field_manager, field_validation], "201");
    create["requestBody"] =
        json!({"content": {"*/*": {"schema": {"$ref": format!("#/components/schemas/{schema}")}}}, "required": true});
    let mut list = op("list or watch objects of kind", "list", &format!("Namespaced{kind}"), vec![], "200");
    list["responses"] = json!({"200": {"description": "OK"}, "401": {"description": "Unauthorized"}});
    let mut paths = Map::new();
    paths.insert(
        format!("{prefix}/namespaces/{{namespace}}/{plural}"),
        json!({"get": list, "post": create, "parameters": [path_param("namespace")]}),
    );
    paths.insert(
        format!("{prefix}/namespaces/{{namespace}}/{plural}/{{name}}"),
        json!({
            "get": op("read", "get", &format!("Namespaced{kind}"), vec![], "200"),
            "delete": op("delete", "delete", &format!("Namespaced{kind}"), vec![], "200"),
            "patch": patch,
            "parameters": [path_param("name"), path_param("namespace")],
        }),
    );
    paths
}

/// The OpenAPI v3 document of one group version, by its discovery path (`api/v1`, `apis/apps/v1`).
fn group_version_document(path: &str) -> Option<Value> {
    let paths = match path {
        "api/v1" => resource_paths("/api/v1", "", "v1", "Pod", "pods", "io.k8s.api.core.v1.Pod"),
        "apis/apps/v1" => {
            resource_paths("/apis/apps/v1", "apps", "v1", "Deployment", "deployments", "io.k8s.api.apps.v1.Deployment")
        }
        _ => return None,
    };
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.34.0-fake"},
        "paths": paths,
        "components": {"schemas": schemas(), "securitySchemes": {"BearerToken": {"type": "apiKey", "description": "Bearer Token authentication", "name": "authorization", "in": "header"}}},
    }))
}

const GROUP_VERSIONS: [&str; 2] = ["api/v1", "apis/apps/v1"];

fn hash(document: &Value) -> String {
    use sha2::Digest;
    hex::encode_upper(sha2::Sha512::digest(document.to_string().as_bytes()))
}

/// `GET /openapi/v3`: where each group version's document is, its URL carrying the document's
/// hash (clients cache by it).
pub(super) async fn v3_root() -> Response {
    let paths: Map<String, Value> = GROUP_VERSIONS
        .iter()
        .filter_map(|gv| {
            let document = group_version_document(gv)?;
            Some(((*gv).to_owned(), json!({"serverRelativeURL": format!("/openapi/v3/{gv}?hash={}", hash(&document))})))
        })
        .collect();
    axum::Json(json!({"paths": paths})).into_response()
}

/// `GET /openapi/v3/{group version}`: JSON (the protobuf form is not served: 406 as the API
/// server answers an Accept it cannot produce). With the current `hash`, cacheable for good as
/// the API server marks it.
pub(super) async fn v3_group_version(
    Path(path): Path<String>,
    Query(q): Query<std::collections::HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    let Some(document) = group_version_document(&path) else {
        return (StatusCode::NOT_FOUND, "404 page not found\n").into_response();
    };
    let accept = headers.get("accept").and_then(|v| v.to_str().ok()).unwrap_or("*/*");
    let json_ok = accept.split(',').any(|a| {
        let a = a.split(';').next().unwrap_or_default().trim();
        a == "application/json" || a == "*/*" || a == "application/*"
    });
    if !json_ok {
        return super::status(
            StatusCode::NOT_ACCEPTABLE,
            "NotAcceptable",
            &format!("only the following media types are accepted: application/json, got {accept}"),
        );
    }
    let etag = format!("\"{}\"", hash(&document));
    let mut response = if headers.get("if-none-match").and_then(|v| v.to_str().ok()) == Some(etag.as_str()) {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        ([("content-type", "application/json")], document.to_string()).into_response()
    };
    let current = q.get("hash").is_some_and(|h| format!("\"{h}\"") == etag);
    let cache = if current { "public, immutable" } else { "no-cache, private" };
    let h = response.headers_mut();
    h.insert("etag", etag.parse().unwrap_or_else(|_| axum::http::HeaderValue::from_static("\"\"")));
    h.insert("cache-control", axum::http::HeaderValue::from_static(cache));
    response
}

/// `GET /openapi/v2`: a valid document (`swagger: "2.0"` and its info) without paths or
/// definitions, in protobuf (gnostic `openapi.v2.Document`) as kubectl asks, or JSON.
pub(super) async fn v2(headers: HeaderMap) -> Response {
    const PROTOBUF: &str = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf";
    let accept = headers.get("accept").and_then(|v| v.to_str().ok()).unwrap_or_default();
    if accept.contains(PROTOBUF) {
        // Document { swagger = 1: "2.0", info = 2: Info { title = 1, version = 2 } }
        let field = |number: u8, bytes: &[u8]| {
            let mut out = vec![(number << 3) | 2, u8::try_from(bytes.len()).unwrap_or(0)];
            out.extend_from_slice(bytes);
            out
        };
        let info = [field(1, b"Kubernetes"), field(2, b"v1.34.0-fake")].concat();
        let document = [field(1, b"2.0"), field(2, &info)].concat();
        // What kube-openapi's handler names the protobuf it returns (a valid media type, unlike
        // the Accept value: Go clients reject a Content-Type with "@").
        return ([("content-type", "application/com.github.proto-openapi.spec.v2.v1.0+protobuf")], document)
            .into_response();
    }
    axum::Json(json!({"swagger": "2.0", "info": {"title": "Kubernetes", "version": "v1.34.0-fake"}, "paths": {}, "definitions": {}}))
        .into_response()
}
